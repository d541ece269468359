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
//! The mount stays while anything is mounted beneath it (a daemon that stops
//! leaves its sandboxes running, and their disks are mounted in the home);
//! the next daemon on the same home finds it and keeps it.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::disk::unescape_mountinfo;
use crate::{Error, Result};

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
    /// Some mount lies strictly below the directory.
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
        let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        if let Err(e) = mount(None::<&str>, &home, None::<&str>, flags, None::<&str>) {
            let _ = umount2(&home, MntFlags::MNT_DETACH);
            return Err(err(e));
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
                if let Err(e) = umount2(&self.path, MntFlags::MNT_DETACH) {
                    tracing::warn!(home = %self.path.display(), "cannot unmount the home's nosuid mount: {e}");
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
        } else if point.len() > dir.len() && point.starts_with(dir) && point[dir.len()] == b'/' {
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
            seen_in(INFO, b"/var/lib/cairn/run"),
            Seen {
                sealed: false,
                below: true
            }
        );
        // A sibling whose name starts the same is not below.
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
        let sub = home.join("run");
        fs::create_dir(&sub).unwrap();
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
}
