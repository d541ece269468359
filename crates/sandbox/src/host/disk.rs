//! The per-task disk: a sparse ext4 image file, attached to a loop device and
//! mounted on the host, that holds the task's overlay upper and work
//! directories. Its size is the task's `--disk` quota: a full disk is ENOSPC
//! inside the sandbox and nowhere else.
//!
//! Formatting an image costs tens of milliseconds, so [`DiskPool`] keeps a few
//! formatted images of the default size ready.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::Duration;

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::{Error, Result};

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
/// Detach the loop device when its last user (our mount) goes away.
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64` from `<linux/loop.h>`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` from `<linux/loop.h>`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// Creates a sparse file of `size` bytes at `path` and formats it as ext4.
/// Written to a temporary name and renamed, so `path` is either absent or a
/// complete filesystem.
pub fn make_image(path: &Path, size: u64) -> Result<()> {
    // A name of its own: two threads may make the same blank at once.
    let tmp = path.with_extension(format!("{:016x}.tmp", rand_u64()));
    let file = File::create(&tmp).map_err(|e| Error::Disk(tmp.clone(), e))?;
    file.set_len(size).map_err(|e| Error::Disk(tmp.clone(), e))?;
    drop(file);
    // Lazy init keeps formatting fast: the kernel zeroes inode tables in the
    // background. 1 % of the blocks is reserved for host root: the sandbox
    // (a mapped uid) cannot take it, so a disk the task filled still has
    // room for the daemon to mount its overlay again (see `SPARE_DIR` for
    // inodes).
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "1", "-E", "lazy_itable_init=1,lazy_journal_init=1", "-L", "cairn"])
        .arg(&tmp)
        .output()
        .map_err(|e| Error::Mkfs(tmp.clone(), format!("cannot run mkfs.ext4 (install e2fsprogs): {e}")))?;
    if !out.status.success() {
        let _ = fs::remove_file(&tmp);
        return Err(Error::Mkfs(tmp, String::from_utf8_lossy(&out.stderr).trim().to_owned()));
    }
    fs::rename(&tmp, path).map_err(|e| Error::Disk(path.to_owned(), e))
}

/// Attaches `image` to a free loop device (auto-clearing) and mounts it at
/// `target` with `nosuid,nodev`: nothing the sandbox writes can become a
/// privilege on the host. With `discard`: blocks the task frees go back to
/// the host's filesystem (the loop device punches holes in the image).
pub fn attach_and_mount(image: &Path, target: &Path) -> Result<PathBuf> {
    fs::create_dir_all(target).map_err(|e| Error::Disk(target.to_owned(), e))?;
    let backing = OpenOptions::new().read(true).write(true).open(image).map_err(|e| Error::Disk(image.to_owned(), e))?;
    let ctl = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .map_err(|e| Error::Loop(image.to_owned(), e))?;
    for _attempt in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(Error::Loop(image.to_owned(), std::io::Error::last_os_error()));
        }
        let dev = PathBuf::from(format!("/dev/loop{n}"));
        let loopdev = match OpenOptions::new().read(true).write(true).open(&dev) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::Loop(dev, e)),
        };
        // SAFETY: LoopConfig is plain old data; all-zero is a valid value.
        let mut config: LoopConfig = unsafe { std::mem::zeroed() };
        config.fd = backing.as_raw_fd() as u32;
        config.info.lo_flags = LO_FLAGS_AUTOCLEAR;
        let name = image.as_os_str().as_bytes();
        let len = name.len().min(63);
        config.info.lo_file_name[..len].copy_from_slice(&name[..len]);
        // SAFETY: `config` is a valid loop_config that outlives the call; the
        // kernel only reads it.
        let rc = unsafe { libc::ioctl(loopdev.as_raw_fd(), LOOP_CONFIGURE, &config as *const LoopConfig) };
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            // Another process took this device between GET_FREE and CONFIGURE.
            if err.raw_os_error() == Some(libc::EBUSY) {
                continue;
            }
            return Err(Error::Loop(dev, err));
        }
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOATIME;
        if let Err(e) = mount(Some(&dev), target, Some("ext4"), flags, Some("discard")) {
            // SAFETY: LOOP_CLR_FD takes no argument.
            unsafe { libc::ioctl(loopdev.as_raw_fd(), LOOP_CLR_FD) };
            return Err(Error::Mount { target: target.to_owned(), err: e.into() });
        }
        // The mount now holds the device; closing our fds lets autoclear
        // detach it when the mount goes away.
        return Ok(dev);
    }
    Err(Error::Loop(image.to_owned(), std::io::Error::other("no free loop device after 16 attempts")))
}

/// Empty files the daemon keeps at the top of a task's disk, where the
/// sandbox never reaches: ext4 reserves blocks for root but no inodes, and
/// mounting the overlay needs a few (its work directory is made anew each
/// time). Before a start they are removed, freeing their inodes for that;
/// after it they are made again while there is room.
const SPARE_DIR: &str = "spare-inodes";
const SPARES: usize = 32;

/// Frees the spare inodes of the disk mounted at `disk`, before a start.
pub fn release_spares(disk: &Path) {
    let dir = disk.join(SPARE_DIR);
    for i in 0..SPARES {
        let _ = fs::remove_file(dir.join(i.to_string()));
    }
}

/// Makes the spare inodes again, as far as there is room, after a start.
pub fn keep_spares(disk: &Path) {
    let dir = disk.join(SPARE_DIR);
    if fs::DirBuilder::new().mode(0o700).create(&dir).is_err() && !dir.is_dir() {
        return;
    }
    for i in 0..SPARES {
        if OpenOptions::new().write(true).create(true).truncate(false).mode(0o600).open(dir.join(i.to_string())).is_err() {
            return;
        }
    }
}

/// Unmounts `target` if it is mounted. Retries briefly while busy, because
/// the last sandbox process may still be exiting.
pub fn unmount(target: &Path) -> Result<()> {
    for attempt in 0.. {
        match umount2(target, MntFlags::empty()) {
            Ok(()) => return Ok(()),
            Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => return Ok(()),
            Err(nix::Error::EBUSY) if attempt < 50 => thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(Error::Umount(target.to_owned(), e.into())),
        }
    }
    unreachable!()
}

/// Loop devices whose backing file is `image` (normally none after unmount).
pub fn loop_devices_backing(image: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir("/sys/block") else { return Vec::new() };
    let want = image.as_os_str().as_bytes();
    entries
        .flatten()
        .filter(|e| e.file_name().as_bytes().starts_with(b"loop"))
        .filter(|e| {
            fs::read(e.path().join("loop/backing_file"))
                .map(|b| b.strip_suffix(b"\n").unwrap_or(&b) == want)
                .unwrap_or(false)
        })
        .map(|e| PathBuf::from("/dev").join(e.file_name()))
        .collect()
}

/// Detaches any loop device still backed by `image` (after a crash).
pub fn detach_backing(image: &Path) -> Result<()> {
    for dev in loop_devices_backing(image) {
        if let Ok(f) = OpenOptions::new().read(true).open(&dev) {
            // SAFETY: LOOP_CLR_FD takes no argument.
            unsafe { libc::ioctl(f.as_raw_fd(), LOOP_CLR_FD) };
        }
    }
    Ok(())
}

/// True when `path` is a mount point in this process's mount namespace.
pub fn is_mounted(path: &Path) -> bool {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else { return false };
    let want = path.as_os_str().as_bytes();
    info.lines().any(|l| l.split(' ').nth(4).map(|p| unescape_mountinfo(p) == want).unwrap_or(false))
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
pub fn unescape_mountinfo(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) if b[i] == b'\\' => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

/// Formatted images of one size, ready to be handed to new tasks.
#[derive(Debug, Clone)]
pub struct DiskPool {
    dir: PathBuf,
    size: u64,
    target: usize,
}

impl DiskPool {
    pub fn new(dir: impl Into<PathBuf>, size: u64, target: usize) -> Result<DiskPool> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| Error::Disk(dir.clone(), e))?;
        // Half-written images from a crash are useless.
        if let Ok(entries) = fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.file_name().as_bytes().ends_with(b".tmp") {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        Ok(DiskPool { dir, size, target })
    }

    fn ready(&self) -> Vec<PathBuf> {
        let Ok(entries) = fs::read_dir(&self.dir) else { return Vec::new() };
        entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "img")).collect()
    }

    /// Puts a formatted image of `size` bytes at `dest`: from the pool when the
    /// size matches, else freshly made. Returns whether the pool served it.
    pub fn take(&self, dest: &Path, size: u64) -> Result<bool> {
        if size == self.size {
            for img in self.ready() {
                // Rename is atomic: of two concurrent takers exactly one wins.
                if fs::rename(&img, dest).is_ok() {
                    return Ok(true);
                }
            }
        }
        self.make(dest, size)?;
        Ok(false)
    }

    /// Formats images until the pool holds its target number.
    pub fn refill(&self) -> Result<()> {
        while self.ready().len() < self.target {
            let name = format!("{:016x}", rand_u64());
            self.make(&self.dir.join(format!("{name}.img")), self.size)?;
        }
        Ok(())
    }

    /// A new formatted image at `dest`: a copy of the blank image of that
    /// size, formatted once. Copying its few megabytes of metadata costs a
    /// fraction of running mkfs.ext4 each time (a process, and every group
    /// descriptor written). The copies share one filesystem UUID, which
    /// nothing mounts by.
    fn make(&self, dest: &Path, size: u64) -> Result<()> {
        let blank = self.dir.join(format!("blank-{size}.ext4"));
        if !blank.exists() {
            make_image(&blank, size)?;
        }
        copy_sparse(&blank, dest)
    }
}

/// Copies `src` to `dest` (through a temporary name and a rename) writing
/// only its data extents, so the copy is as sparse as the original.
fn copy_sparse(src: &Path, dest: &Path) -> Result<()> {
    use rustix::fs::{copy_file_range, seek, SeekFrom};
    let tmp = dest.with_extension(format!("{:016x}.tmp", rand_u64()));
    let copy = || -> std::io::Result<()> {
        let from = File::open(src)?;
        let to = File::create(&tmp)?;
        let len = from.metadata()?.len();
        to.set_len(len)?;
        let mut pos = 0;
        while pos < len {
            let start = match seek(&from, SeekFrom::Data(pos)) {
                Ok(at) => at,
                Err(rustix::io::Errno::NXIO) => break, // only a hole is left
                Err(e) => return Err(e.into()),
            };
            let end = seek(&from, SeekFrom::Hole(start))?;
            let (mut at_in, mut at_out) = (start, start);
            while at_in < end {
                let want = usize::try_from(end - at_in).unwrap_or(usize::MAX);
                if copy_file_range(&from, Some(&mut at_in), &to, Some(&mut at_out), want)? == 0 {
                    return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "blank image shrank while copied"));
                }
            }
            pos = end;
        }
        Ok(())
    };
    if let Err(e) = copy() {
        let _ = fs::remove_file(&tmp);
        return Err(Error::Disk(dest.to_owned(), e));
    }
    fs::rename(&tmp, dest).map_err(|e| Error::Disk(dest.to_owned(), e))
}

fn rand_u64() -> u64 {
    let mut buf = [0u8; 8];
    // SAFETY: getrandom writes at most buf.len() bytes into buf.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n != 8 {
        return std::process::id() as u64 ^ (std::time::SystemTime::now().elapsed().map(|d| d.as_nanos()).unwrap_or(1) as u64);
    }
    u64::from_ne_bytes(buf)
}

/// Path as a C string, for syscalls that take one.
pub(crate) fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Error::Io(p.display().to_string(), std::io::Error::other("path contains NUL")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(unescape_mountinfo(r"/a\040b"), b"/a b");
        assert_eq!(unescape_mountinfo("/plain"), b"/plain");
        assert_eq!(unescape_mountinfo(r"/x\"), b"/x\\");
    }

    /// Real loop device and ext4 as root: the quota holds and nothing leaks.
    #[test]
    fn disk_quota_and_cleanup() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("d.img");
        let mnt = dir.path().join("m");
        make_image(&img, 64 << 20).unwrap();
        attach_and_mount(&img, &mnt).unwrap();
        let guard = scopeguard(&mnt, &img);
        assert!(is_mounted(&mnt));
        assert_eq!(loop_devices_backing(&img).len(), 1);
        // Filling past the size fails with ENOSPC.
        let mut f = File::create(mnt.join("fill")).unwrap();
        let chunk = vec![7u8; 1 << 20];
        let err = (0..200).find_map(|_| std::io::Write::write_all(&mut f, &chunk).err()).expect("disk never filled");
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
        drop(f);
        drop(guard);
        assert!(!is_mounted(&mnt));
        assert!(loop_devices_backing(&img).is_empty(), "autoclear detached the loop device");
    }

    struct Cleanup(PathBuf, PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = unmount(&self.0);
            let _ = detach_backing(&self.1);
        }
    }
    fn scopeguard(m: &Path, i: &Path) -> Cleanup {
        Cleanup(m.to_owned(), i.to_owned())
    }

    #[test]
    fn pool_serves_default_size_and_refills() {
        let dir = tempfile::tempdir().unwrap();
        let pool = DiskPool::new(dir.path().join("pool"), 64 << 20, 2).unwrap();
        pool.refill().unwrap();
        assert_eq!(pool.ready().len(), 2);
        assert!(pool.take(&dir.path().join("a.img"), 64 << 20).unwrap(), "served from the pool");
        assert!(!pool.take(&dir.path().join("b.img"), 128 << 20).unwrap(), "other sizes are made fresh");
        assert_eq!(fs::metadata(dir.path().join("b.img")).unwrap().len(), 128 << 20);
        assert_eq!(pool.ready().len(), 1);
        pool.refill().unwrap();
        assert_eq!(pool.ready().len(), 2);
    }

    /// Disks are copies of one blank per size: sparse, each a whole
    /// filesystem of its own once mounted.
    #[test]
    fn disks_are_sparse_copies_of_a_blank_of_their_size() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let pool = DiskPool::new(dir.path().join("pool"), 64 << 20, 0).unwrap();
        let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
        pool.take(&a, 1 << 30).unwrap();
        pool.take(&b, 1 << 30).unwrap();
        let blank = fs::metadata(dir.path().join("pool").join(format!("blank-{}.ext4", 1u64 << 30))).unwrap();
        let copy = fs::metadata(&b).unwrap();
        assert_eq!(copy.len(), 1 << 30);
        assert!(copy.blocks() * 512 < 64 << 20, "a sparse copy: {} bytes allocated", copy.blocks() * 512);
        // Preallocated extents that read as zeros (the journal) stay holes.
        assert!(copy.blocks() <= blank.blocks(), "no more than the blank's extents");
        let (ma, mb) = (dir.path().join("ma"), dir.path().join("mb"));
        attach_and_mount(&a, &ma).unwrap();
        let _ga = scopeguard(&ma, &a);
        attach_and_mount(&b, &mb).unwrap();
        let _gb = scopeguard(&mb, &b);
        fs::write(ma.join("only-in-a"), b"a").unwrap();
        assert!(!mb.join("only-in-a").exists(), "two disks, two filesystems");
        assert!(fs::read_dir(dir.path().join("pool")).unwrap().flatten().all(|e| !e.file_name().as_bytes().ends_with(b".tmp")));
    }
}
