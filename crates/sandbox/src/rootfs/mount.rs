//! The mount operations a sandbox root is built from, behind a small trait so
//! the plans in [`super`] can be checked without root by a recording double.
//! Every operation that lands in the sandbox root takes a [`Place::Inside`],
//! which the real kernel reaches without following links (see [`super::place`]).

#[cfg(test)]
use std::cell::RefCell;
use std::fs;
use std::os::fd::RawFd;
use std::os::unix::fs::{chown, symlink, DirBuilderExt};
use std::path::{Path, PathBuf};

use cairn_fsat as fsat;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::place::{self, fd_path, Missing, Place};
use crate::{Error, Result};

pub trait Mounter {
    fn mount(&self, source: &str, target: &Place, fstype: &str, flags: MsFlags, data: Option<&str>) -> Result<()>;
    /// Binds the host path `source` onto `target`.
    fn bind(&self, source: &Path, target: &Place, flags: MsFlags) -> Result<()>;
    fn bind_idmapped(&self, source: &Path, target: &Path, userns: RawFd) -> Result<()>;
    /// `mkdir -p` with `mode` for the directories it creates. True when it
    /// made the last one.
    fn mkdir(&self, at: &Place, mode: u32) -> Result<bool>;
    /// Creates an empty file to bind a device node onto.
    fn touch(&self, at: &Place) -> Result<()>;
    fn symlink(&self, target: &str, link: &Place) -> Result<()>;
    /// Changes the owner of the directory `at`.
    fn chown(&self, at: &Place, uid: u32, gid: u32) -> Result<()>;
    /// Makes `new_root` the root and detaches the old one.
    fn pivot_root(&self, new_root: &Path) -> Result<()>;
}

/// The real kernel.
#[derive(Debug, Default)]
pub struct Kernel;

impl Kernel {
    /// `mount(2)` onto `target`: a host path as it is, a place in the
    /// sandbox root through `/proc/self/fd/N` of the entry opened there.
    fn mount_on(&self, target: &Place, op: &'static str, call: impl Fn(&Path) -> nix::Result<()>) -> Result<()> {
        let err = |e: nix::Error| Error::Mount { target: PathBuf::from(target.to_string()), err: e.into() };
        match target {
            Place::Host(p) => call(p).map_err(err),
            Place::Inside { root, rel } => {
                let fd = place::mount_target(root, rel, op)?;
                call(Path::new(&fd_path(&fd))).map_err(err)
            }
        }
    }
}

impl Mounter for Kernel {
    fn mount(&self, source: &str, target: &Place, fstype: &str, flags: MsFlags, data: Option<&str>) -> Result<()> {
        self.mount_on(target, "mount on", |t| mount(Some(source), t, Some(fstype), flags, data))
    }

    fn bind(&self, source: &Path, target: &Place, flags: MsFlags) -> Result<()> {
        self.mount_on(target, "bind onto", |t| mount(Some(source), t, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>))?;
        if !flags.is_empty() {
            // Bind flags only take effect on a remount, of the new mount:
            // looked up again, the target is now its root.
            self.mount_on(target, "bind onto", |t| {
                mount(None::<&str>, t, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REMOUNT | flags, None::<&str>)
            })?;
        }
        Ok(())
    }

    fn bind_idmapped(&self, source: &Path, target: &Path, userns: RawFd) -> Result<()> {
        super::idmap::bind_idmapped(source, target, userns)
    }

    fn mkdir(&self, at: &Place, mode: u32) -> Result<bool> {
        match at {
            Place::Host(path) => {
                let existed = path.is_dir();
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(mode)
                    .create(path)
                    .map_err(|e| Error::Io(format!("mkdir {}", path.display()), e))?;
                Ok(!existed)
            }
            Place::Inside { root, rel } => Ok(place::walk(root, rel, Missing::Create(mode), "create directory")?.1),
        }
    }

    fn touch(&self, at: &Place) -> Result<()> {
        match at {
            Place::Host(path) => fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path)
                .map(drop)
                .map_err(|e| Error::Io(format!("create {}", path.display()), e)),
            Place::Inside { root, rel } => place::touch(root, rel, "create").map(drop),
        }
    }

    fn symlink(&self, target: &str, link: &Place) -> Result<()> {
        match link {
            Place::Host(path) => symlink(target, path).map_err(|e| Error::Io(format!("symlink {}", path.display()), e)),
            Place::Inside { root, rel } => {
                let (dir, name, seen) = place::parent(root, rel, "create symlink")?;
                let err = |e| Error::Io(format!("symlink {}", seen.display()), e);
                let target = fsat::cstr(target.as_ref()).map_err(err)?;
                fsat::symlink_at(&target, &dir, &name).map_err(err)
            }
        }
    }

    fn chown(&self, at: &Place, uid: u32, gid: u32) -> Result<()> {
        match at {
            Place::Host(path) => chown(path, Some(uid), Some(gid)).map_err(|e| Error::Io(format!("chown {}", path.display()), e)),
            Place::Inside { root, rel } => {
                let (dir, _) = place::walk(root, rel, Missing::Fail, "chown")?;
                fsat::fchown(&dir, uid, gid).map_err(|e| Error::Io(format!("chown {at}"), e))
            }
        }
    }

    fn pivot_root(&self, new_root: &Path) -> Result<()> {
        nix::unistd::chdir(new_root).map_err(|e| Error::sys("chdir to new root", e))?;
        // The root came from a more privileged mount namespace, so it is
        // locked, and pivot_root refuses locked mounts. A clone of it made
        // here is not; stack it on top and step into it.
        let clone = super::idmap::clone_tree(Path::new("."))?;
        super::idmap::attach(&clone, Path::new("."))?;
        nix::unistd::fchdir(std::os::fd::AsRawFd::as_raw_fd(&clone)).map_err(|e| Error::sys("enter cloned root", e))?;
        drop(clone);
        // pivot_root(".", ".") stacks the old root on top of the new one,
        // so it can be detached without a directory to put it in.
        nix::unistd::pivot_root(".", ".").map_err(|e| Error::sys("pivot_root", e))?;
        umount2(".", MntFlags::MNT_DETACH).map_err(|e| Error::Umount(PathBuf::from("old root"), e.into()))?;
        nix::unistd::chdir("/").map_err(|e| Error::sys("chdir /", e))?;
        Ok(())
    }
}

#[cfg(test)]
/// One recorded operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Mount { source: String, target: Place, fstype: String, flags: MsFlags, data: Option<String> },
    Bind { source: PathBuf, target: Place, flags: MsFlags },
    BindIdmapped { source: PathBuf, target: PathBuf },
    Mkdir(Place, u32),
    Touch(Place),
    Symlink(String, Place),
    Chown(Place, u32, u32),
    PivotRoot(PathBuf),
}

#[cfg(test)]
/// Test double: records what would be done, does nothing. Every directory
/// it is asked to make is missing, so it is "made".
#[derive(Debug, Default)]
pub struct Recorder {
    pub ops: RefCell<Vec<Op>>,
    /// Paths in the sandbox (`/workspace`) to act as symlinks: an operation
    /// on a [`Place::Inside`] at or under one fails as the kernel's would.
    pub symlinks: Vec<PathBuf>,
}

#[cfg(test)]
impl Recorder {
    /// Records `op` unless `at` lies at or under one of [`Self::symlinks`].
    fn record(&self, at: Option<&Place>, what: &'static str, op: Op) -> Result<()> {
        if let Some(Place::Inside { rel, .. }) = at {
            let path = Path::new("/").join(rel);
            if let Some(link) = self.symlinks.iter().find(|l| path.starts_with(l)) {
                return Err(Error::RootSymlink { op: what, target: path.display().to_string(), link: link.display().to_string() });
            }
        }
        self.ops.borrow_mut().push(op);
        Ok(())
    }
}

#[cfg(test)]
impl Mounter for Recorder {
    fn mount(&self, source: &str, target: &Place, fstype: &str, flags: MsFlags, data: Option<&str>) -> Result<()> {
        let op = Op::Mount { source: source.into(), target: target.clone(), fstype: fstype.into(), flags, data: data.map(Into::into) };
        self.record(Some(target), "mount on", op)
    }
    fn bind(&self, source: &Path, target: &Place, flags: MsFlags) -> Result<()> {
        self.record(Some(target), "bind onto", Op::Bind { source: source.into(), target: target.clone(), flags })
    }
    fn bind_idmapped(&self, source: &Path, target: &Path, _userns: RawFd) -> Result<()> {
        self.record(None, "bind onto", Op::BindIdmapped { source: source.into(), target: target.into() })
    }
    fn mkdir(&self, at: &Place, mode: u32) -> Result<bool> {
        self.record(Some(at), "create directory", Op::Mkdir(at.clone(), mode))?;
        Ok(true)
    }
    fn touch(&self, at: &Place) -> Result<()> {
        self.record(Some(at), "create", Op::Touch(at.clone()))
    }
    fn symlink(&self, target: &str, link: &Place) -> Result<()> {
        self.record(Some(link), "create symlink", Op::Symlink(target.into(), link.clone()))
    }
    fn chown(&self, at: &Place, uid: u32, gid: u32) -> Result<()> {
        self.record(Some(at), "chown", Op::Chown(at.clone(), uid, gid))
    }
    fn pivot_root(&self, new_root: &Path) -> Result<()> {
        self.record(None, "pivot into", Op::PivotRoot(new_root.into()))
    }
}

#[cfg(test)]
mod tests {
    //! The real kernel against a sandbox root holding links to a "host"
    //! directory. Needs root; mounts happen in a thread's own mount
    //! namespace, which goes away with the thread, also when it panics.

    use std::os::unix::fs::MetadataExt;

    use nix::sched::{unshare, CloneFlags};

    use super::*;

    const TMPFS_MAGIC: i64 = 0x0102_1994;

    use crate::rootfs::fixture::tree;

    fn is_link(r: Result<impl std::fmt::Debug>, link: &str) -> bool {
        matches!(r, Err(Error::RootSymlink { link: ref l, .. }) if l == link)
    }

    /// Runs `f` in a new thread with a private mount namespace of its own.
    fn in_own_mount_ns<T: Send>(f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                unshare(CloneFlags::CLONE_NEWNS).unwrap();
                mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>).unwrap();
                f()
            })
            .join()
            .unwrap()
        })
    }

    #[test]
    fn files_and_owners_never_go_through_a_link() {
        let t = tree();
        let k = Kernel;
        assert!(is_link(k.mkdir(&t.at("/l/sub"), 0o755), "/l"));
        assert!(is_link(k.mkdir(&t.at("/dangling"), 0o755), "/dangling"));
        assert!(is_link(k.mkdir(&t.at("/dangling/sub"), 0o755), "/dangling"));
        assert!(is_link(k.touch(&t.at("/l/null")), "/l"));
        assert!(is_link(k.touch(&t.at("/dangling")), "/dangling"));
        assert!(is_link(k.chown(&t.at("/l"), 4242, 4242), "/l"));
        assert!(is_link(k.symlink("x", &t.at("/l/link")), "/l"));
        t.host_untouched();

        // Positive control: the same calls on a plain tree.
        assert!(k.mkdir(&t.at("/d/a/b"), 0o755).unwrap());
        assert!(!k.mkdir(&t.at("/d/a/b"), 0o755).unwrap(), "made only once");
        k.chown(&t.at("/d/a/b"), 4242, 4343).unwrap();
        let m = fs::metadata(t.root.join("d/a/b")).unwrap();
        assert_eq!((m.uid(), m.gid()), (4242, 4343));
        k.touch(&t.at("/d/null")).unwrap();
        assert!(t.root.join("d/null").is_file());
        k.symlink("pts/ptmx", &t.at("/d/ptmx")).unwrap();
        assert_eq!(fs::read_link(t.root.join("d/ptmx")).unwrap(), Path::new("pts/ptmx"));
        t.host_untouched();
    }

    #[test]
    fn mounts_land_on_the_entry_found_beneath_the_root() {
        let t = tree();
        in_own_mount_ns(|| {
            let k = Kernel;
            assert!(is_link(k.mount("tmpfs", &t.at("/l"), "tmpfs", MsFlags::empty(), None), "/l"));
            assert!(is_link(k.mount("tmpfs", &t.at("/l/marker"), "tmpfs", MsFlags::empty(), None), "/l"));
            assert!(is_link(k.bind(Path::new("/dev/null"), &t.at("/dangling"), MsFlags::empty()), "/dangling"));
            assert!(is_link(k.bind(Path::new("/dev/null"), &t.at("/l/marker"), MsFlags::MS_RDONLY), "/l"));
            t.host_untouched();

            // Positive control: a tmpfs, a device bound onto a file, and a
            // read-only bind (remounted through a second lookup).
            k.mkdir(&t.at("/d/tmp"), 0o1777).unwrap();
            k.mount("tmpfs", &t.at("/d/tmp"), "tmpfs", MsFlags::MS_NOSUID, Some("size=64k")).unwrap();
            assert_eq!(fsat::fs_magic(fsat::open_dir(&t.root.join("d/tmp")).unwrap()).unwrap(), TMPFS_MAGIC);
            k.touch(&t.at("/d/tmp/null")).unwrap();
            k.bind(Path::new("/dev/null"), &t.at("/d/tmp/null"), MsFlags::empty()).unwrap();
            assert!(matches!(fsat::kind(&fsat::fstat(fs::File::open(t.root.join("d/tmp/null")).unwrap()).unwrap()), fsat::Kind::CharDevice { .. }));
            k.mkdir(&t.at("/d/ro"), 0o755).unwrap();
            k.bind(&t.root.join("d/tmp"), &t.at("/d/ro"), MsFlags::MS_RDONLY).unwrap();
            let e = fs::write(t.root.join("d/ro/x"), "x").unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
            t.host_untouched();
        });
        assert_ne!(fsat::fs_magic(fsat::open_dir(&t.root.join("d/tmp")).unwrap()).unwrap(), TMPFS_MAGIC, "gone with the thread's namespace");
    }
}
