//! The sandbox's root filesystem, built in two halves:
//!
//! 1. [`build_overlays`], by the helper as host root in its own mount
//!    namespace: each image layer is bind-mounted idmapped (so host-root
//!    files look root-owned inside) and becomes the lower of an overlay whose
//!    upper and work directories live on the task's disk.
//! 2. [`build_inner`], by the sandbox's init inside its user, mount and pid
//!    namespaces: `/proc`, a minimal `/dev`, `/dev/pts`, `/dev/shm`, `/tmp`,
//!    then `pivot_root`.
//!
//! Both take a [`Mounter`], so the order and options of every mount are
//! unit-tested with the recording double.

pub mod idmap;
pub mod mount;

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;
use serde::{Deserialize, Serialize};

pub use mount::{Kernel, Mounter, Op, Recorder};

use crate::uidmap::IdRange;
use crate::{Error, Result};

/// One read-only lower layer and where it appears in the sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layer {
    pub lower: PathBuf,
    /// Absolute path inside the sandbox: `/` for the image root.
    pub at: PathBuf,
}

impl Layer {
    /// Name of the layer's upper/work directories on the task disk.
    pub fn disk_name(&self) -> String {
        let rel = self.at.to_string_lossy().trim_matches('/').replace('/', "_");
        if rel.is_empty() {
            "root".to_owned()
        } else {
            format!("at_{rel}")
        }
    }
}

/// Device nodes bound from the host into the sandbox's `/dev`.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Mounts the overlay stack under `run_dir/root` and returns that path.
/// `layers[0]` must be the image root (`/`); later layers mount inside it.
pub fn build_overlays(
    m: &impl Mounter,
    run_dir: &Path,
    disk: &Path,
    layers: &[Layer],
    ids: IdRange,
    userns: RawFd,
    workdir: &str,
) -> Result<PathBuf> {
    if layers.first().map(|l| l.at.as_path()) != Some(Path::new("/")) {
        return Err(Error::Helper("the first layer must be the image root".into()));
    }
    let root = run_dir.join("root");
    let sandbox_root = (ids.host_id(0), ids.host_id(0));
    for (i, layer) in layers.iter().enumerate() {
        let lower = run_dir.join(format!("lower{i}"));
        let upper = disk.join(layer.disk_name()).join("upper");
        let work = disk.join(layer.disk_name()).join("work");
        for p in [&lower, &upper, &work] {
            check_overlay_path(p)?;
        }
        m.mkdir(&lower, 0o700)?;
        m.bind_idmapped(&layer.lower, &lower, userns)?;
        m.mkdir(&upper, 0o755)?;
        m.mkdir(&work, 0o700)?;
        // The merged directory takes its owner from the upper: make it the
        // sandbox's root.
        m.chown(&upper, sandbox_root.0, sandbox_root.1)?;
        let target = join_inside(&root, &layer.at);
        m.mkdir(&target, 0o755)?;
        let data = format!("lowerdir={},upperdir={},workdir={}", lower.display(), upper.display(), work.display());
        m.mount("overlay", &target, "overlay", MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some(&data))?;
    }
    let wd = join_inside(&root, Path::new(workdir));
    if !wd.exists() {
        m.mkdir(&wd, 0o755)?;
        m.chown(&wd, sandbox_root.0, sandbox_root.1)?;
    }
    Ok(root)
}

/// Mounts the kernel filesystems and `/dev` inside `root`, then pivots into
/// it. Runs as the sandbox's root in its own namespaces.
pub fn build_inner(m: &impl Mounter, root: &Path, tmp_bytes: u64) -> Result<()> {
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    m.mkdir(&root.join("proc"), 0o555)?;
    m.mount("proc", &root.join("proc"), "proc", nosuid_nodev | MsFlags::MS_NOEXEC, None)?;

    let dev = root.join("dev");
    m.mkdir(&dev, 0o755)?;
    m.mount("tmpfs", &dev, "tmpfs", MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC, Some("mode=755,size=64k"))?;
    for name in DEVICES {
        let node = dev.join(name);
        m.touch(&node)?;
        m.bind(&Path::new("/dev").join(name), &node, MsFlags::empty())?;
    }
    m.mkdir(&dev.join("pts"), 0o755)?;
    m.mount(
        "devpts",
        &dev.join("pts"),
        "devpts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )?;
    m.symlink("pts/ptmx", &dev.join("ptmx"))?;
    m.mkdir(&dev.join("shm"), 0o1777)?;
    m.mount("shm", &dev.join("shm"), "tmpfs", nosuid_nodev, Some("mode=1777,size=64m"))?;
    for (link, target) in [("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")] {
        m.symlink(target, &dev.join(link))?;
    }

    m.mkdir(&root.join("tmp"), 0o1777)?;
    m.mount("tmpfs", &root.join("tmp"), "tmpfs", nosuid_nodev, Some(&format!("mode=1777,size={tmp_bytes}")))?;
    m.pivot_root(root)
}

/// `root` joined with an absolute in-sandbox path.
fn join_inside(root: &Path, inside: &Path) -> PathBuf {
    root.join(inside.strip_prefix("/").unwrap_or(inside))
}

/// overlayfs splits its options on `,` and lower layers on `:`.
fn check_overlay_path(p: &Path) -> Result<()> {
    let s = p.to_string_lossy();
    if s.contains([',', ':', '\\']) {
        return Err(Error::Helper(format!("path {s:?} cannot be used by overlayfs (contains ',', ':' or '\\')")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers() -> Vec<Layer> {
        vec![
            Layer { lower: "/images/host/rootfs".into(), at: "/".into() },
            Layer { lower: "/usr".into(), at: "/usr".into() },
        ]
    }

    #[test]
    fn overlays_stack_idmapped_lowers_on_the_task_disk() {
        let m = Recorder::default();
        let ids = IdRange::for_slot(2).unwrap();
        let root = build_overlays(&m, Path::new("/run/t1"), Path::new("/disk/t1"), &layers(), ids, -1, "/nonexistent-wd").unwrap();
        assert_eq!(root, Path::new("/run/t1/root"));
        let ops = m.ops.borrow();
        let base = ids.host_id(0);
        let expect_root_overlay = Op::Mount {
            source: "overlay".into(),
            target: "/run/t1/root".into(),
            fstype: "overlay".into(),
            flags: MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            data: Some("lowerdir=/run/t1/lower0,upperdir=/disk/t1/root/upper,workdir=/disk/t1/root/work".into()),
        };
        let i_idmap = ops.iter().position(|o| *o == Op::BindIdmapped { source: "/images/host/rootfs".into(), target: "/run/t1/lower0".into() }).unwrap();
        let i_chown = ops.iter().position(|o| *o == Op::Chown("/disk/t1/root/upper".into(), base, base)).unwrap();
        let i_root = ops.iter().position(|o| *o == expect_root_overlay).unwrap();
        let i_usr = ops
            .iter()
            .position(|o| matches!(o, Op::Mount { target, data: Some(d), .. } if target == Path::new("/run/t1/root/usr") && d.starts_with("lowerdir=/run/t1/lower1,upperdir=/disk/t1/at_usr/upper")))
            .unwrap();
        assert!(i_idmap < i_root && i_chown < i_root && i_root < i_usr, "lower before overlay, / before /usr: {ops:#?}");
        assert!(ops.contains(&Op::Chown("/run/t1/root/nonexistent-wd".into(), base, base)), "workdir owned by sandbox root");
    }

    #[test]
    fn refuses_a_stack_without_root_and_bad_paths() {
        let m = Recorder::default();
        let ids = IdRange::for_slot(0).unwrap();
        assert!(build_overlays(&m, Path::new("/r"), Path::new("/d"), &layers()[1..], ids, -1, "/w").is_err());
        assert!(build_overlays(&m, Path::new("/r,x"), Path::new("/d"), &layers(), ids, -1, "/w").is_err());
    }

    #[test]
    fn inner_root_has_kernel_fs_minimal_dev_and_pivots_last() {
        let m = Recorder::default();
        build_inner(&m, Path::new("/run/t1/root"), 256 << 20).unwrap();
        let ops = m.ops.borrow();
        let fstypes: Vec<(&str, &Path)> = ops
            .iter()
            .filter_map(|o| match o {
                Op::Mount { fstype, target, .. } => Some((fstype.as_str(), target.as_path())),
                _ => None,
            })
            .collect();
        assert_eq!(
            fstypes,
            [
                ("proc", Path::new("/run/t1/root/proc")),
                ("tmpfs", Path::new("/run/t1/root/dev")),
                ("devpts", Path::new("/run/t1/root/dev/pts")),
                ("tmpfs", Path::new("/run/t1/root/dev/shm")),
                ("tmpfs", Path::new("/run/t1/root/tmp")),
            ]
        );
        let binds: Vec<_> = ops.iter().filter_map(|o| if let Op::Bind { source, .. } = o { Some(source.clone()) } else { None }).collect();
        assert_eq!(binds, DEVICES.iter().map(|d| Path::new("/dev").join(d)).collect::<Vec<_>>(), "only the minimal devices");
        assert!(ops.iter().any(|o| matches!(o, Op::Mount { fstype, data: Some(d), .. } if fstype == "tmpfs" && d.contains("size=268435456"))));
        assert_eq!(ops.last(), Some(&Op::PivotRoot("/run/t1/root".into())));
    }
}
