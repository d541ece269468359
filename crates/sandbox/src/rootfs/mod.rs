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
//! unit-tested with the recording double. Whatever they make or mount on
//! inside the root is a [`Place::Inside`], reached beneath a descriptor of
//! the root without following a symlink: the root's contents are the
//! image's and the sandbox's own, and a link planted there must not lead
//! host root to a host path ([`place`]).

pub mod idmap;
pub mod mount;
pub mod place;
#[cfg(test)]
mod fixture;

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

#[cfg(test)]
pub use mount::{Op, Recorder};
pub use mount::{Kernel, Mounter};
pub use place::Place;

use cairn_image::Layer;

use crate::uidmap::IdRange;
use crate::{Error, Result};

/// overlayfs refuses more lower directories than this (`OVL_MAX_STACK`).
pub const MAX_LOWERS: usize = 500;

/// The kernel copies mount options into one page; longer ones are refused.
const MOUNT_DATA_MAX: usize = 4095;

/// Device nodes bound from the host into the sandbox's `/dev`.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// How the image's layers are bound as the overlay's lower directories.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LowerIds {
    /// Idmapped through this user namespace: host root's files look like
    /// the sandbox's root's (the native driver).
    Idmapped(RawFd),
    /// As they are on the host, read-only: for a gvisor sandbox, whose
    /// second kernel is the one that maps ids.
    AsTheyAre,
}

/// Mounts the overlay stack under `run_dir/root` and returns that path.
/// `layers[0]` must be the image root (`/`); later layers mount inside it.
/// With [`LowerIds::Idmapped`] the caller's working directory must be
/// `run_dir` (see [`as_shown`]).
pub fn build_overlays(
    m: &impl Mounter,
    run_dir: &Path,
    disk: &Path,
    layers: &[Layer],
    ids: IdRange,
    lower_ids: LowerIds,
    workdir: &str,
) -> Result<PathBuf> {
    if layers.first().map(|l| l.at.as_path()) != Some(Path::new("/")) {
        return Err(Error::Helper("the first layer must be the image root".into()));
    }
    let root = run_dir.join("root");
    let sandbox_root = (ids.host_id(0), ids.host_id(0));
    for (i, layer) in layers.iter().enumerate() {
        if layer.lowers.is_empty() || layer.lowers.len() > MAX_LOWERS {
            return Err(Error::Helper(format!(
                "the layer at {} has {} lower directories; overlayfs takes 1 to {MAX_LOWERS}",
                layer.at.display(),
                layer.lowers.len()
            )));
        }
        // One lower keeps the name it always had; a stack numbers its own.
        let lowers: Vec<PathBuf> = if layer.lowers.len() == 1 {
            vec![run_dir.join(format!("lower{i}"))]
        } else {
            (0..layer.lowers.len()).map(|j| run_dir.join(format!("lower{i}.{j}"))).collect()
        };
        let upper = disk.join(layer.disk_name()).join("upper");
        let work = disk.join(layer.disk_name()).join("work");
        for p in lowers.iter().chain([&upper, &work]) {
            check_overlay_path(p)?;
        }
        let shown = |p: &Path| as_shown(p, run_dir, lower_ids);
        let lowerdir = lowers.iter().map(|l| shown(l)).collect::<Vec<_>>().join(":");
        let data = format!("lowerdir={lowerdir},upperdir={},workdir={}", shown(&upper), shown(&work));
        if data.len() > MOUNT_DATA_MAX {
            return Err(Error::Helper(format!(
                "the overlay at {} needs {} bytes of mount options for its {} lower directories; the kernel takes {MOUNT_DATA_MAX}",
                layer.at.display(),
                data.len(),
                lowers.len()
            )));
        }
        let upper_at = Place::Host(upper.clone());
        for (host, lower) in layer.lowers.iter().zip(&lowers) {
            m.mkdir(&Place::Host(lower.clone()), 0o700)?;
            match lower_ids {
                LowerIds::Idmapped(userns) => m.bind_idmapped(host, lower, userns)?,
                LowerIds::AsTheyAre => m.bind(host, &Place::Host(lower.clone()), MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?,
            }
        }
        m.mkdir(&upper_at, 0o755)?;
        m.mkdir(&Place::Host(work.clone()), 0o700)?;
        // The merged directory takes its owner from the upper: make it the
        // sandbox's root.
        m.chown(&upper_at, sandbox_root.0, sandbox_root.1)?;
        // The image root goes on the run directory; every later layer
        // inside what is mounted there.
        let target = if i == 0 { Place::Host(root.clone()) } else { Place::inside(&root, &layer.at) };
        m.mkdir(&target, 0o755)?;
        // A native sandbox's overlay lives only in its own mount namespace
        // and honours set-id bits there (its root is an unprivileged host
        // uid); a gvisor one is mounted on the host, where they mean nothing.
        let flags = match lower_ids {
            LowerIds::Idmapped(_) => MsFlags::MS_NODEV,
            LowerIds::AsTheyAre => MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        };
        m.mount("overlay", &target, "overlay", flags, Some(&data))?;
    }
    let wd = Place::inside(&root, workdir);
    match m.mkdir(&wd, 0o755) {
        Ok(true) => m.chown(&wd, sandbox_root.0, sandbox_root.1)?,
        Ok(false) => {}
        // The sandbox made the workdir, or a directory above it, a link.
        // Nothing is made through it here; commands start in the workdir
        // after the pivot, where the link resolves inside the sandbox.
        Err(Error::RootSymlink { .. }) => {}
        Err(e) => return Err(e),
    }
    Ok(root)
}

/// How an overlay's option names a path. The native helper mounts from
/// `run_dir` as its working directory, so its options name paths relative
/// to it: a sandbox reads them in its own `/proc/self/mountinfo`, and
/// absolute ones would show it the daemon's home and the task's layout on
/// the host. A gvisor overlay is mounted by the daemon, whose working
/// directory is not its own to change, and is never shown to the sandbox.
fn as_shown(p: &Path, run_dir: &Path, lower_ids: LowerIds) -> String {
    match (lower_ids, p.strip_prefix(run_dir)) {
        (LowerIds::Idmapped(_), Ok(rel)) if !rel.as_os_str().is_empty() => rel.display().to_string(),
        _ => p.display().to_string(),
    }
}

/// Mounts the kernel filesystems and `/dev` inside `root`, then pivots into
/// it. Runs as the sandbox's root in its own namespaces.
pub fn build_inner(m: &impl Mounter, root: &Path, tmp_bytes: u64) -> Result<()> {
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let proc = Place::inside(root, "proc");
    m.mkdir(&proc, 0o555)?;
    m.mount("proc", &proc, "proc", nosuid_nodev | MsFlags::MS_NOEXEC, None)?;

    let dev = Place::inside(root, "dev");
    m.mkdir(&dev, 0o755)?;
    m.mount("tmpfs", &dev, "tmpfs", MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC, Some("mode=755,size=64k"))?;
    for name in DEVICES {
        let node = dev.join(name);
        m.touch(&node)?;
        m.bind(&Path::new("/dev").join(name), &node, MsFlags::empty())?;
    }
    let pts = dev.join("pts");
    m.mkdir(&pts, 0o755)?;
    m.mount("devpts", &pts, "devpts", MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC, Some("newinstance,ptmxmode=0666,mode=0620"))?;
    m.symlink("pts/ptmx", &dev.join("ptmx"))?;
    let shm = dev.join("shm");
    m.mkdir(&shm, 0o1777)?;
    m.mount("shm", &shm, "tmpfs", nosuid_nodev, Some("mode=1777,size=64m"))?;
    for (link, target) in [("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")] {
        m.symlink(target, &dev.join(link))?;
    }

    let tmp = Place::inside(root, "tmp");
    m.mkdir(&tmp, 0o1777)?;
    m.mount("tmpfs", &tmp, "tmpfs", nosuid_nodev, Some(&format!("mode=1777,size={tmp_bytes}")))?;
    m.pivot_root(root)
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
            Layer { lowers: vec!["/images/host/rootfs".into()], at: "/".into(), history: 0 },
            Layer { lowers: vec!["/usr".into()], at: "/usr".into(), history: 0 },
        ]
    }

    /// The place an operation lands on, if it has one.
    fn place_of(op: &Op) -> Option<&Place> {
        match op {
            Op::Mount { target, .. } | Op::Bind { target, .. } | Op::Mkdir(target, _) | Op::Touch(target) | Op::Symlink(_, target) | Op::Chown(target, ..) => Some(target),
            Op::BindIdmapped { .. } | Op::PivotRoot(_) => None,
        }
    }

    /// Nothing under the sandbox root is addressed by a host path: all of
    /// it is looked up beneath the root without following links.
    fn nothing_by_host_path_under(root: &Path, ops: &[Op]) {
        for op in ops {
            if let Some(Place::Host(p)) = place_of(op) {
                assert!(!p.starts_with(root) || p == root, "{op:?} goes by host path into the sandbox root");
            }
            if let Op::BindIdmapped { target, .. } = op {
                assert!(!target.starts_with(root), "{op:?}");
            }
        }
    }

    #[test]
    fn overlays_stack_idmapped_lowers_on_the_task_disk() {
        let m = Recorder::default();
        let ids = IdRange::for_slot(2).unwrap();
        let root = build_overlays(&m, Path::new("/run/t1"), Path::new("/disk/t1"), &layers(), ids, LowerIds::Idmapped(-1), "/nonexistent-wd").unwrap();
        assert_eq!(root, Path::new("/run/t1/root"));
        let ops = m.ops.borrow();
        let base = ids.host_id(0);
        let expect_root_overlay = Op::Mount {
            source: "overlay".into(),
            target: Place::Host("/run/t1/root".into()),
            fstype: "overlay".into(),
            // Set-id bits work inside (the overlay is in the sandbox's own
            // mount namespace); device nodes never do.
            flags: MsFlags::MS_NODEV,
            // The disk is not under the run directory here: its paths stay
            // absolute.
            data: Some("lowerdir=lower0,upperdir=/disk/t1/root/upper,workdir=/disk/t1/root/work".into()),
        };
        let i_idmap = ops.iter().position(|o| *o == Op::BindIdmapped { source: "/images/host/rootfs".into(), target: "/run/t1/lower0".into() }).unwrap();
        let i_chown = ops.iter().position(|o| *o == Op::Chown(Place::Host("/disk/t1/root/upper".into()), base, base)).unwrap();
        let i_root = ops.iter().position(|o| *o == expect_root_overlay).unwrap();
        let usr = Place::inside("/run/t1/root", "/usr");
        let i_usr_dir = ops.iter().position(|o| *o == Op::Mkdir(usr.clone(), 0o755)).unwrap();
        let i_usr = ops
            .iter()
            .position(|o| matches!(o, Op::Mount { target, data: Some(d), .. } if *target == usr && d.starts_with("lowerdir=lower1,upperdir=/disk/t1/at_usr/upper")))
            .unwrap();
        assert!(i_idmap < i_root && i_chown < i_root && i_root < i_usr_dir && i_usr_dir < i_usr, "lower before overlay, / before /usr: {ops:#?}");
        let wd = Place::inside("/run/t1/root", "/nonexistent-wd");
        assert!(ops.contains(&Op::Mkdir(wd.clone(), 0o755)) && ops.contains(&Op::Chown(wd, base, base)), "workdir made, owned by sandbox root");
        nothing_by_host_path_under(&root, &ops);
    }

    #[test]
    fn a_link_in_the_root_fails_a_layer_and_leaves_the_workdir_alone() {
        let ids = IdRange::for_slot(2).unwrap();
        let build = |links: &[&str], workdir: &str| {
            let m = Recorder { symlinks: links.iter().map(PathBuf::from).collect(), ..Recorder::default() };
            let r = build_overlays(&m, Path::new("/run/t1"), Path::new("/disk/t1"), &layers(), ids, LowerIds::Idmapped(-1), workdir);
            (r, m.ops.into_inner())
        };
        // A layer mounted on a link: the start fails, naming the link.
        let (r, ops) = build(&["/usr"], "/w");
        let e = r.unwrap_err();
        assert!(matches!(&e, Error::RootSymlink { link, .. } if link == "/usr"), "{e}");
        assert!(e.to_string().contains("/usr is a symlink"), "{e}");
        assert!(!ops.iter().any(|o| matches!(o, Op::Mount { target, .. } if *target == Place::inside("/run/t1/root", "/usr"))));
        // A workdir that is, or lies under, a link: nothing made or chowned.
        for (links, workdir) in [(&["/workspace"][..], "/workspace"), (&["/a"][..], "/a/b")] {
            let (r, ops) = build(links, workdir);
            assert_eq!(r.unwrap(), Path::new("/run/t1/root"));
            assert!(!ops.iter().any(|o| matches!(place_of(o), Some(Place::Inside { rel, .. }) if rel.starts_with(links[0].trim_start_matches('/')))), "{ops:#?}");
            assert!(ops.iter().any(|o| matches!(o, Op::Mount { target, .. } if *target == Place::inside("/run/t1/root", "/usr"))), "the rest is built");
        }
        // Positive control: without the link the workdir is made and chowned.
        let (r, ops) = build(&["/elsewhere"], "/a/b");
        r.unwrap();
        assert!(ops.iter().any(|o| matches!(o, Op::Chown(p, ..) if *p == Place::inside("/run/t1/root", "/a/b"))));
    }

    #[test]
    fn refuses_a_stack_without_root_and_bad_paths() {
        let m = Recorder::default();
        let ids = IdRange::for_slot(0).unwrap();
        assert!(build_overlays(&m, Path::new("/r"), Path::new("/d"), &layers()[1..], ids, LowerIds::Idmapped(-1), "/w").is_err());
        assert!(build_overlays(&m, Path::new("/r,x"), Path::new("/d"), &layers(), ids, LowerIds::Idmapped(-1), "/w").is_err());
    }

    #[test]
    fn a_stack_of_lowers_is_bound_each_and_mounted_top_first() {
        let m = Recorder::default();
        let ids = IdRange::for_slot(1).unwrap();
        let stack = vec![Layer { lowers: vec!["/l/top".into(), "/l/mid".into(), "/l/base".into()], at: "/".into(), history: 0 }];
        build_overlays(&m, Path::new("/run/t1"), Path::new("/disk/t1"), &stack, ids, LowerIds::Idmapped(-1), "/w").unwrap();
        let ops = m.ops.borrow();
        let binds: Vec<_> = ops.iter().filter_map(|o| if let Op::BindIdmapped { source, target } = o { Some((source.clone(), target.clone())) } else { None }).collect();
        assert_eq!(
            binds,
            [("/l/top", "/run/t1/lower0.0"), ("/l/mid", "/run/t1/lower0.1"), ("/l/base", "/run/t1/lower0.2")].map(|(s, t)| (PathBuf::from(s), PathBuf::from(t)))
        );
        let data = "lowerdir=lower0.0:lower0.1:lower0.2,upperdir=/disk/t1/root/upper,workdir=/disk/t1/root/work";
        let i_mount = ops.iter().position(|o| matches!(o, Op::Mount { data: Some(d), .. } if d == data)).unwrap();
        let last_bind = ops.iter().rposition(|o| matches!(o, Op::BindIdmapped { .. })).unwrap();
        assert!(last_bind < i_mount, "every lower bound before the overlay: {ops:#?}");
    }

    #[test]
    fn a_stack_too_deep_or_too_long_for_the_kernel_is_refused() {
        let ids = IdRange::for_slot(1).unwrap();
        let try_as = |n: usize, run: &str, lower_ids: LowerIds| {
            let m = Recorder::default();
            let stack = vec![Layer { lowers: (0..n).map(|j| PathBuf::from(format!("/l/{j}"))).collect(), at: "/".into(), history: 0 }];
            let r = build_overlays(&m, Path::new(run), Path::new("/d"), &stack, ids, lower_ids, "/w");
            (r, m.ops.into_inner())
        };
        let try_with = |n: usize, run: &str| try_as(n, run, LowerIds::AsTheyAre);
        let (r, ops) = try_with(MAX_LOWERS + 1, "/r");
        assert!(r.unwrap_err().to_string().contains("lower directories; overlayfs takes 1 to 500"));
        assert!(ops.is_empty(), "nothing mounted: {ops:?}");
        let (r, _) = try_with(0, "/r");
        assert!(r.is_err());
        // 100 lowers under a long run directory do not fit in one page.
        let long_run = format!("/run/{}", "x".repeat(60));
        let (r, ops) = try_with(100, &long_run);
        let e = r.unwrap_err().to_string();
        assert!(e.contains("bytes of mount options for its 100 lower directories"), "{e}");
        assert!(!ops.iter().any(|o| matches!(o, Op::Mount { .. } | Op::BindIdmapped { .. })), "{ops:?}");
        // The same stack under a short one does.
        let (r, _) = try_with(100, "/r");
        r.unwrap();
        // The native helper names lowers relative to the run directory: its
        // length does not count, but 500 lowers still do not fit.
        let (r, _) = try_as(100, &long_run, LowerIds::Idmapped(-1));
        r.unwrap();
        let (r, _) = try_as(MAX_LOWERS, "/r", LowerIds::Idmapped(-1));
        assert!(r.unwrap_err().to_string().contains("bytes of mount options"));
    }

    #[test]
    fn inner_root_has_kernel_fs_minimal_dev_and_pivots_last() {
        let m = Recorder::default();
        let root = Path::new("/run/t1/root");
        build_inner(&m, root, 256 << 20).unwrap();
        let ops = m.ops.borrow();
        let fstypes: Vec<(&str, String)> = ops
            .iter()
            .filter_map(|o| match o {
                Op::Mount { fstype, target, .. } => Some((fstype.as_str(), target.to_string())),
                _ => None,
            })
            .collect();
        assert_eq!(
            fstypes,
            [("proc", "/proc"), ("tmpfs", "/dev"), ("devpts", "/dev/pts"), ("tmpfs", "/dev/shm"), ("tmpfs", "/tmp")].map(|(f, t)| (f, t.to_owned()))
        );
        for op in ops.iter() {
            if let Some(p) = place_of(op) {
                assert!(matches!(p, Place::Inside { root: r, .. } if r == root), "{op:?} is looked up beneath the root");
            }
        }
        let binds: Vec<_> = ops.iter().filter_map(|o| if let Op::Bind { source, .. } = o { Some(source.clone()) } else { None }).collect();
        assert_eq!(binds, DEVICES.iter().map(|d| Path::new("/dev").join(d)).collect::<Vec<_>>(), "only the minimal devices");
        assert!(ops.iter().any(|o| matches!(o, Op::Mount { fstype, data: Some(d), .. } if fstype == "tmpfs" && d.contains("size=268435456"))));
        assert_eq!(ops.last(), Some(&Op::PivotRoot("/run/t1/root".into())));
    }

    #[test]
    fn mount_options_of_exactly_a_page_less_its_nul_fit() {
        let ids = IdRange::for_slot(1).unwrap();
        let stack = vec![Layer { lowers: vec!["/l/0".into()], at: "/".into(), history: 0 }];
        let data_len = |run: &str| format!("lowerdir={run}/lower0,upperdir=/d/root/upper,workdir=/d/root/work").len();
        let fits = |run: &str| build_overlays(&Recorder::default(), Path::new(run), Path::new("/d"), &stack, ids, LowerIds::AsTheyAre, "/w").is_ok();
        let run = format!("/{}", "x".repeat(MOUNT_DATA_MAX - data_len("/")));
        assert_eq!(data_len(&run), MOUNT_DATA_MAX);
        assert!(fits(&run), "4095 bytes and the NUL fill the page");
        assert!(!fits(&format!("{run}x")), "one more does not fit");
    }

    #[test]
    fn inner_mounts_take_exactly_their_flags() {
        let m = Recorder::default();
        build_inner(&m, Path::new("/run/t1/root"), 1 << 20).unwrap();
        let flags: Vec<(String, MsFlags)> =
            m.ops.borrow().iter().filter_map(|o| if let Op::Mount { target, flags, .. } = o { Some((target.to_string(), *flags)) } else { None }).collect();
        let (nosuid, nodev, noexec) = (MsFlags::MS_NOSUID, MsFlags::MS_NODEV, MsFlags::MS_NOEXEC);
        assert_eq!(
            flags,
            [
                ("/proc", nosuid | nodev | noexec),
                ("/dev", nosuid | noexec),
                ("/dev/pts", nosuid | noexec),
                ("/dev/shm", nosuid | nodev),
                ("/tmp", nosuid | nodev),
            ]
            .map(|(t, f)| (t.to_owned(), f))
        );
    }

    #[test]
    fn gvisor_lowers_are_bound_read_only_and_its_overlay_has_no_set_id_or_devices() {
        let m = Recorder::default();
        let ids = IdRange::for_slot(2).unwrap();
        build_overlays(&m, Path::new("/run/t1"), Path::new("/disk/t1"), &layers(), ids, LowerIds::AsTheyAre, "/w").unwrap();
        let ops = m.ops.borrow();
        let binds: Vec<MsFlags> = ops.iter().filter_map(|o| if let Op::Bind { flags, .. } = o { Some(*flags) } else { None }).collect();
        assert_eq!(binds, [MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV; 2]);
        let mounts: Vec<MsFlags> = ops.iter().filter_map(|o| if let Op::Mount { flags, .. } = o { Some(*flags) } else { None }).collect();
        assert_eq!(mounts, [MsFlags::MS_NOSUID | MsFlags::MS_NODEV; 2]);
    }

    #[test]
    fn overlay_options_name_paths_under_the_run_directory_relatively_for_the_native_helper() {
        let run = Path::new("/run/t1");
        assert_eq!(as_shown(&run.join("lower0"), run, LowerIds::Idmapped(-1)), "lower0");
        // The run directory itself has no relative name but its own.
        assert_eq!(as_shown(run, run, LowerIds::Idmapped(-1)), "/run/t1");
        assert_eq!(as_shown(Path::new("/disk/t1/root/upper"), run, LowerIds::Idmapped(-1)), "/disk/t1/root/upper");
        assert_eq!(as_shown(&run.join("lower0"), run, LowerIds::AsTheyAre), "/run/t1/lower0");
    }

    #[test]
    fn inner_root_refuses_a_linked_mount_point() {
        for link in ["/proc", "/dev", "/tmp"] {
            let m = Recorder { symlinks: vec![link.into()], ..Recorder::default() };
            let e = build_inner(&m, Path::new("."), 1 << 20).unwrap_err();
            assert!(matches!(&e, Error::RootSymlink { link: l, .. } if l == link), "{e}");
            assert!(!m.ops.borrow().iter().any(|o| matches!(o, Op::PivotRoot(_))), "no pivot into a half-built root");
        }
    }
}
