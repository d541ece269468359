//! The mount operations a sandbox root is built from, behind a small trait so
//! the plans in [`super`] can be checked without root by a recording double.

use std::cell::RefCell;
use std::fs;
use std::os::fd::RawFd;
use std::os::unix::fs::{chown, symlink, DirBuilderExt};
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::{Error, Result};

pub trait Mounter {
    fn mount(&self, source: &str, target: &Path, fstype: &str, flags: MsFlags, data: Option<&str>) -> Result<()>;
    fn bind(&self, source: &Path, target: &Path, flags: MsFlags) -> Result<()>;
    fn bind_idmapped(&self, source: &Path, target: &Path, userns: RawFd) -> Result<()>;
    /// `mkdir -p` with `mode` for the directories it creates.
    fn mkdir(&self, path: &Path, mode: u32) -> Result<()>;
    /// Creates an empty file to bind a device node onto.
    fn touch(&self, path: &Path) -> Result<()>;
    fn symlink(&self, target: &str, link: &Path) -> Result<()>;
    fn chown(&self, path: &Path, uid: u32, gid: u32) -> Result<()>;
    /// Makes `new_root` the root and detaches the old one.
    fn pivot_root(&self, new_root: &Path) -> Result<()>;
}

/// The real kernel.
#[derive(Debug, Default)]
pub struct Kernel;

impl Mounter for Kernel {
    fn mount(&self, source: &str, target: &Path, fstype: &str, flags: MsFlags, data: Option<&str>) -> Result<()> {
        mount(Some(source), target, Some(fstype), flags, data)
            .map_err(|e| Error::Mount { target: target.to_owned(), err: e.into() })
    }

    fn bind(&self, source: &Path, target: &Path, flags: MsFlags) -> Result<()> {
        let err = |e: nix::Error| Error::Mount { target: target.to_owned(), err: e.into() };
        mount(Some(source), target, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>).map_err(err)?;
        if !flags.is_empty() {
            // Bind flags only take effect on a remount.
            mount(None::<&str>, target, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REMOUNT | flags, None::<&str>)
                .map_err(err)?;
        }
        Ok(())
    }

    fn bind_idmapped(&self, source: &Path, target: &Path, userns: RawFd) -> Result<()> {
        super::idmap::bind_idmapped(source, target, userns)
    }

    fn mkdir(&self, path: &Path, mode: u32) -> Result<()> {
        fs::DirBuilder::new().recursive(true).mode(mode).create(path).map_err(|e| Error::Io(format!("mkdir {}", path.display()), e))
    }

    fn touch(&self, path: &Path) -> Result<()> {
        fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map(drop)
            .map_err(|e| Error::Io(format!("create {}", path.display()), e))
    }

    fn symlink(&self, target: &str, link: &Path) -> Result<()> {
        symlink(target, link).map_err(|e| Error::Io(format!("symlink {}", link.display()), e))
    }

    fn chown(&self, path: &Path, uid: u32, gid: u32) -> Result<()> {
        chown(path, Some(uid), Some(gid)).map_err(|e| Error::Io(format!("chown {}", path.display()), e))
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

/// One recorded operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Mount { source: String, target: PathBuf, fstype: String, flags: MsFlags, data: Option<String> },
    Bind { source: PathBuf, target: PathBuf, flags: MsFlags },
    BindIdmapped { source: PathBuf, target: PathBuf },
    Mkdir(PathBuf, u32),
    Touch(PathBuf),
    Symlink(String, PathBuf),
    Chown(PathBuf, u32, u32),
    PivotRoot(PathBuf),
}

/// Test double: records what would be done, does nothing.
#[derive(Debug, Default)]
pub struct Recorder {
    pub ops: RefCell<Vec<Op>>,
}

impl Mounter for Recorder {
    fn mount(&self, source: &str, target: &Path, fstype: &str, flags: MsFlags, data: Option<&str>) -> Result<()> {
        self.ops.borrow_mut().push(Op::Mount {
            source: source.into(),
            target: target.into(),
            fstype: fstype.into(),
            flags,
            data: data.map(Into::into),
        });
        Ok(())
    }
    fn bind(&self, source: &Path, target: &Path, flags: MsFlags) -> Result<()> {
        self.ops.borrow_mut().push(Op::Bind { source: source.into(), target: target.into(), flags });
        Ok(())
    }
    fn bind_idmapped(&self, source: &Path, target: &Path, _userns: RawFd) -> Result<()> {
        self.ops.borrow_mut().push(Op::BindIdmapped { source: source.into(), target: target.into() });
        Ok(())
    }
    fn mkdir(&self, path: &Path, mode: u32) -> Result<()> {
        self.ops.borrow_mut().push(Op::Mkdir(path.into(), mode));
        Ok(())
    }
    fn touch(&self, path: &Path) -> Result<()> {
        self.ops.borrow_mut().push(Op::Touch(path.into()));
        Ok(())
    }
    fn symlink(&self, target: &str, link: &Path) -> Result<()> {
        self.ops.borrow_mut().push(Op::Symlink(target.into(), link.into()));
        Ok(())
    }
    fn chown(&self, path: &Path, uid: u32, gid: u32) -> Result<()> {
        self.ops.borrow_mut().push(Op::Chown(path.into(), uid, gid));
        Ok(())
    }
    fn pivot_root(&self, new_root: &Path) -> Result<()> {
        self.ops.borrow_mut().push(Op::PivotRoot(new_root.into()));
        Ok(())
    }
}
