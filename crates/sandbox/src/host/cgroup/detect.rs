//! Finding the cgroup hierarchies in `/proc/self/mountinfo`.
//!
//! A mountinfo line looks like
//!
//! ```text
//! 35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
//! ```
//!
//! that is: id, parent id, device, root, mount point, mount options, zero or
//! more optional fields, a `-` separator, then filesystem type, source and
//! superblock options. For a v1 hierarchy the superblock options name its
//! controllers (`cpu,cpuacct` when several are co-mounted); a `cgroup2` mount
//! has no controllers there, they are listed in its `cgroup.controllers`.

use std::path::{Path, PathBuf};

use super::Hierarchies;
use crate::{Error, Result};

/// One cgroup filesystem mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Mount {
    pub path: PathBuf,
    /// `None` for cgroup2; the controllers (and `name=` tags) for v1.
    pub v1_controllers: Option<Vec<String>>,
}

impl Mount {
    fn has_v1(&self, controller: &str) -> bool {
        self.v1_controllers.as_ref().is_some_and(|c| c.iter().any(|x| x == controller))
    }
}

/// Every `cgroup` and `cgroup2` mount, in mount order.
pub(super) fn cgroup_mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mount> {
    let fields: Vec<&str> = line.split(' ').collect();
    // The optional fields make the separator's position vary.
    let sep = fields.iter().position(|f| *f == "-")?;
    let mount_point = *fields.get(4)?;
    let fstype = *fields.get(sep + 1)?;
    let super_opts = fields.get(sep + 3).copied().unwrap_or("");
    let path = PathBuf::from(unescape(mount_point));
    match fstype {
        "cgroup2" => Some(Mount { path, v1_controllers: None }),
        "cgroup" => {
            // Superblock options mix controllers with generic flags
            // (`rw`, `nosuid`, `xattr`, `release_agent=...`); keep only what
            // could name a controller.
            let controllers = super_opts
                .split(',')
                .filter(|o| !matches!(*o, "rw" | "ro" | "xattr" | "noprefix" | "clone_children" | "cpuset_v2_mode"))
                .filter(|o| !o.starts_with("release_agent="))
                .map(str::to_owned)
                .collect();
            Some(Mount { path, v1_controllers: Some(controllers) })
        }
        _ => None,
    }
}

/// Undoes the octal escapes (`\040` for a space) the kernel applies to
/// whitespace and backslashes in mount points.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let digits = b.get(i + 1..i + 4).filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let (b'\\', Some(d)) = (b[i], digits) {
            let v = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            if let Ok(byte) = u8::try_from(v) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Chooses the hierarchies Cairn uses from the mounts found.
///
/// A host with a v1 `memory` hierarchy is driven through v1 (legacy or
/// hybrid); a cgroup2 mount next to it, if any, is kept for `cgroup.kill` and
/// `cgroup.freeze`. Otherwise the cgroup2 mount is used for everything, and
/// it must offer the memory controller. `rebase` maps a mount point to where
/// its files are (the identity, except in tests).
pub(super) fn choose(mounts: &[Mount], rebase: impl Fn(&Path) -> PathBuf) -> Result<Hierarchies> {
    let v1 = |controller: &str| mounts.iter().find(|m| m.has_v1(controller)).map(|m| rebase(&m.path));
    let unified = mounts.iter().find(|m| m.v1_controllers.is_none()).map(|m| rebase(&m.path));

    if let Some(memory) = v1("memory") {
        let need = |controller: &'static str| {
            v1(controller).ok_or_else(|| {
                Error::CgroupDetect(format!(
                    "cgroup v1 has a memory hierarchy at {} but no {controller} hierarchy is mounted; \
                     mount one (mount -t cgroup -o {controller} cgroup /sys/fs/cgroup/{controller}) \
                     or boot with cgroup v2",
                    memory.display()
                ))
            })
        };
        return Ok(Hierarchies::V1 { cpu: need("cpu")?, pids: need("pids")?, freezer: v1("freezer"), memory, unified });
    }

    let Some(root) = unified else {
        let what = if mounts.is_empty() {
            "no cgroup or cgroup2 filesystem is mounted".to_owned()
        } else {
            "cgroup v1 is mounted without a memory hierarchy, and there is no cgroup2 mount".to_owned()
        };
        return Err(Error::CgroupDetect(format!(
            "{what} (per /proc/self/mountinfo); mount cgroup2 at /sys/fs/cgroup \
             (mount -t cgroup2 none /sys/fs/cgroup)"
        )));
    };

    let file = root.join("cgroup.controllers");
    let text = std::fs::read_to_string(&file).map_err(|e| Error::Cgroup(file.clone(), e))?;
    let controllers: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
    if !controllers.iter().any(|c| c == "memory") {
        return Err(Error::CgroupDetect(format!(
            "the cgroup2 hierarchy at {} does not offer the memory controller (its cgroup.controllers \
             lists {:?}), so memory limits cannot be enforced; it is either bound to a cgroup v1 \
             hierarchy or disabled on the kernel command line (cgroup_disable=memory)",
            root.display(),
            text.trim()
        )));
    }
    Ok(Hierarchies::V2 { dir: root, controllers })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v1_and_v2_lines() {
        let text = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:10 - cgroup cgroup rw,cpu,cpuacct
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime shared:5 master:1 - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";
        let m = cgroup_mounts(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].path, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
        assert!(m[0].has_v1("cpu") && m[0].has_v1("cpuacct") && !m[0].has_v1("rw"));
        assert_eq!(m[1].v1_controllers.as_deref(), Some(&["name=systemd".to_owned()][..]));
        assert_eq!(m[2], Mount { path: "/sys/fs/cgroup/unified".into(), v1_controllers: None });
    }

    #[test]
    fn unescapes_mount_points() {
        assert_eq!(unescape(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape(r"/tmp/back\134slash"), r"/tmp/back\slash");
        assert_eq!(unescape(r"/tmp/odd\04"), r"/tmp/odd\04");
    }

    #[test]
    fn ignores_garbage_lines() {
        assert!(cgroup_mounts("\nnot a mountinfo line\n1 2 3\n").is_empty());
    }
}
