//! The daemon's home, mounted on itself `nosuid,nodev`.
//!
//! Image layers, templates, fork bases and restores hold what sandboxes
//! made, set-id bits, file capabilities and all: they are kept because they
//! mean something inside a sandbox. On the host they must mean nothing, and
//! the host's root filesystem is usually mounted without `nosuid`. Every
//! path into the home goes through this bind mount, whose flags make the
//! kernel ignore set-id bits, file capabilities and device nodes on exec and
//! open, whoever runs them (the task disks mounted below it carry the same
//! flags themselves).
//!
//! The mount keeps the home's own flags (`ro`, `noexec`, atime). It stays
//! while anything is mounted beneath it (a daemon that stops leaves its
//! sandboxes running, and their disks are mounted in the home); the next
//! daemon on the same home finds it and keeps it. Only a mount a daemon made
//! (marked by [`MARKER`] in the home) is ever removed: an operator's own
//! `nosuid,nodev` mount of the home (an fstab line, which also covers the
//! time no daemon runs) is left alone.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::statvfs::{statvfs, FsFlags};

use crate::host::disk::unescape_mountinfo;
use crate::{Error, Result};

/// The file in the home that says its `nosuid` mount is a daemon's.
pub const MARKER: &str = "home-mount";

/// The home's own mount, held by the driver for the daemon's life.
#[derive(Debug)]
pub struct HomeMount {
    path: PathBuf,
    released: AtomicBool,
}

/// What mountinfo says of the mounts at or below one directory.
#[derive(Debug, Default, PartialEq, Eq)]
struct Seen {
    /// The topmost mount exactly at the directory has `nosuid` and `nodev`.
    sealed: bool,
    /// A sandbox's mount lies below the directory (in its `run/`); other
    /// mounts below (an operator's) were copied into the bind and go with it.
    below: bool,
}

/// Mounts `home` on itself with `nosuid,nodev`, unless a mount with those
/// flags is there already. `home` must exist and be absolute.
pub fn seal(home: &Path) -> Result<HomeMount> {
    let home = fs::canonicalize(home).map_err(|e| Error::Io(home.display().to_string(), e))?;
    if !look(&home)?.sealed {
        let err = |e: nix::Error| Error::Mount {
            target: home.clone(),
            err: e.into(),
        };
        // Recursive: a disk left mounted by an older daemon stays reachable.
        mount(
            Some(&home),
            &home,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(err)?;
        // A bind remount sets every per-mount flag: keep the home's own.
        let kept = statvfs(&home).map(|v| kept_flags(v.flags())).map_err(err)?;
        let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | kept;
        if let Err(e) = mount(None::<&str>, &home, None::<&str>, flags, None::<&str>) {
            let _ = umount2(&home, MntFlags::MNT_DETACH);
            return Err(err(e));
        }
        let marker = home.join(MARKER);
        if let Err(e) = fs::write(&marker, b"") {
            let _ = umount2(&home, MntFlags::MNT_DETACH);
            return Err(Error::Io(marker.display().to_string(), e));
        }
        tracing::debug!(home = %home.display(), "home mounted on itself nosuid,nodev");
    }
    Ok(HomeMount {
        path: home,
        released: AtomicBool::new(false),
    })
}

impl HomeMount {
    /// The daemon stops: removes the mount when nothing is mounted beneath
    /// it any more. Open files in it stay valid (a lazy unmount).
    pub fn release(&self) {
        if self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        match look(&self.path) {
            Ok(Seen { below: true, .. }) => {
                tracing::info!(home = %self.path.display(), "sandboxes still mounted in the home: its nosuid mount stays for the next daemon")
            }
            Ok(Seen {
                sealed: true,
                below: false,
            }) => {
                let marker = self.path.join(MARKER);
                if fs::remove_file(&marker).is_err() {
                    // Not a daemon's mount (or not ours to judge): left as it is.
                    return;
                }
                if let Err(e) = umount2(&self.path, MntFlags::MNT_DETACH) {
                    tracing::warn!(home = %self.path.display(), "cannot unmount the home's nosuid mount: {e}");
                    let _ = fs::write(&marker, b"");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("{e}"),
        }
    }
}

impl Drop for HomeMount {
    fn drop(&mut self) {
        self.release();
    }
}

/// The per-mount flags of the home's own mount that its bind keeps.
fn kept_flags(home: FsFlags) -> MsFlags {
    [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ]
    .into_iter()
    .filter(|(has, _)| home.contains(*has))
    .fold(MsFlags::empty(), |all, (_, flag)| all | flag)
}

fn look(dir: &Path) -> Result<Seen> {
    let info = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Error::Io("/proc/self/mountinfo".into(), e))?;
    Ok(seen_in(&info, dir.as_os_str().as_bytes()))
}

/// Reads mountinfo lines (`id parent major:minor root mountpoint options
/// ...`); later lines are mounted on top of earlier ones.
fn seen_in(mountinfo: &str, dir: &[u8]) -> Seen {
    let mut seen = Seen::default();
    for line in mountinfo.lines() {
        let mut fields = line.split(' ');
        let (Some(point), Some(options)) = (fields.nth(4), fields.next()) else {
            continue;
        };
        let point = unescape_mountinfo(point);
        if point == dir {
            let opts: Vec<&str> = options.split(',').collect();
            seen.sealed = opts.contains(&"nosuid") && opts.contains(&"nodev");
        } else if point.starts_with(dir) && point[dir.len()..].starts_with(b"/run/") {
            seen.below = true;
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
90 22 254:0 /var/lib/cairn /var/lib/cairn rw,nosuid,nodev,relatime shared:1 - ext4 /dev/vda rw
91 90 7:3 / /var/lib/cairn/run/t1/disk rw,nosuid,nodev - ext4 /dev/loop3 rw
";

    #[test]
    fn the_topmost_mount_decides_and_mounts_below_are_seen() {
        assert_eq!(
            seen_in(INFO, b"/var/lib/cairn"),
            Seen {
                sealed: true,
                below: true
            }
        );
        assert_eq!(
            seen_in(INFO, b"/var/lib/cairn/run/t1"),
            Seen {
                sealed: false,
                below: false
            }
        );
        let layers = format!("{INFO}93 90 0:40 / /var/lib/cairn/layers rw - tmpfs tmpfs rw\n");
        assert!(!seen_in(&layers, b"/var/lib/cairn/layers").below);
        // A sibling whose name starts the same is not below, nor is a mount
        // outside `run/` a sandbox's.
        assert_eq!(
            seen_in(INFO, b"/var/lib/cai"),
            Seen {
                sealed: false,
                below: false
            }
        );
        let covered = format!(
            "{INFO}92 90 254:0 /var/lib/cairn /var/lib/cairn rw,relatime - ext4 /dev/vda rw\n"
        );
        assert!(
            !seen_in(&covered, b"/var/lib/cairn").sealed,
            "a plain mount on top wins"
        );
    }

    #[test]
    fn a_home_is_mounted_nosuid_once_and_released_when_nothing_is_below() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test mounts: run it as root"
        );
        let d = tempfile::tempdir().unwrap();
        let home = fs::canonicalize(d.path()).unwrap();
        let first = seal(&home).unwrap();
        assert!(look(&home).unwrap().sealed);
        let vfs = nix::sys::statvfs::statvfs(&home).unwrap();
        assert!(
            vfs.flags().contains(nix::sys::statvfs::FsFlags::ST_NOSUID),
            "the home itself is nosuid"
        );
        assert!(vfs.flags().contains(nix::sys::statvfs::FsFlags::ST_NODEV));
        // A second daemon on the same home keeps the one there.
        let second = seal(&home).unwrap();
        let count = |info: &str| {
            info.lines()
                .filter(|l| l.split(' ').nth(4) == Some(home.to_str().unwrap()))
                .count()
        };
        assert_eq!(
            count(&fs::read_to_string("/proc/self/mountinfo").unwrap()),
            1
        );
        // With something mounted beneath, a release keeps it.
        let sub = home.join("run/t1");
        fs::create_dir_all(&sub).unwrap();
        mount(
            Some("tmpfs"),
            &sub,
            Some("tmpfs"),
            MsFlags::empty(),
            Some("size=64k"),
        )
        .unwrap();
        second.release();
        assert!(look(&home).unwrap().sealed, "kept while a mount is beneath");
        umount2(&sub, MntFlags::empty()).unwrap();
        first.release();
        assert_eq!(
            count(&fs::read_to_string("/proc/self/mountinfo").unwrap()),
            0,
            "released once nothing is below"
        );
    }

    #[test]
    fn the_homes_own_flags_are_kept_and_an_operators_mount_is_left_alone() {
        assert!(nix::unistd::geteuid().is_root(), "this test mounts: run it as root");
        let flags_of = |p: &Path| nix::sys::statvfs::statvfs(p).unwrap().flags();
        // A home on a noexec filesystem stays noexec under the daemon's mount.
        let d = tempfile::tempdir().unwrap();
        let home = fs::canonicalize(d.path()).unwrap();
        mount(Some("tmpfs"), &home, Some("tmpfs"), MsFlags::MS_NOEXEC, Some("size=64k")).unwrap();
        let ours = seal(&home).unwrap();
        let flags = flags_of(&home);
        assert!(flags.contains(FsFlags::ST_NOSUID) && flags.contains(FsFlags::ST_NODEV), "sealed: {flags:?}");
        assert!(flags.contains(FsFlags::ST_NOEXEC), "the home's noexec is kept: {flags:?}");
        assert!(home.join(MARKER).exists(), "the daemon's mount is marked");
        ours.release();
        assert!(!flags_of(&home).contains(FsFlags::ST_NOSUID), "the daemon's own mount is removed");
        umount2(&home, MntFlags::empty()).unwrap();

        // An operator's nosuid,nodev mount of the home is used and kept.
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        mount(Some("tmpfs"), &home, Some("tmpfs"), flags, Some("size=64k")).unwrap();
        let theirs = seal(&home).unwrap();
        assert!(!home.join(MARKER).exists(), "no second mount, no marker");
        theirs.release();
        let left = flags_of(&home);
        umount2(&home, MntFlags::empty()).unwrap();
        assert!(left.contains(FsFlags::ST_NOSUID), "the operator's mount stays after a release");
    }
}
