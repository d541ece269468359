//! Who a command runs as: a `user[:group]` (names or numbers) resolved to
//! ids the way container runtimes do, from the sandbox's own `/etc/passwd`
//! and `/etc/group`.
//!
//! This runs in the init, after the pivot: the files read are the
//! sandbox's, through its own root, so nothing the sandbox controls is
//! ever looked up by path on the host. They are read without following a
//! symlink, as regular files only (a FIFO must not stall pid 1), and only
//! up to [`MAX_DB`] bytes.

use cairn_fsat::{self as fsat, OFlags};

/// The largest `/etc/passwd` or `/etc/group` read.
const MAX_DB: u64 = 4 << 20;

/// Ids inside the sandbox's user namespace go up to this (exclusive).
const IDS: u32 = 65536;

/// The ids a command switches to, and its home directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Creds {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// From `/etc/passwd`; `/` when the user has no entry.
    pub home: String,
}

/// Resolves `spec` against the sandbox's `/etc/passwd` and `/etc/group`.
/// The error is one line naming what was wrong.
pub fn resolve(spec: &str) -> Result<Creds, String> {
    let (passwd, group) = (read_db("passwd"), read_db("group"));
    resolve_in(spec, passwd, group)
}

/// One of the sandbox's `/etc` files, as text (or why it could not be read).
fn read_db(name: &str) -> Result<String, String> {
    let open = || -> std::io::Result<Vec<u8>> {
        let root = fsat::open_dir(std::path::Path::new("/"))?;
        let etc = fsat::open_beneath(&root, "etc", OFlags::RDONLY | OFlags::DIRECTORY, 0)?;
        let name = std::ffi::CString::new(name).map_err(std::io::Error::other)?;
        fsat::read_regular_at(&etc, &name, MAX_DB)
    };
    open().map(|b| String::from_utf8_lossy(&b).into_owned()).map_err(|e| format!("/etc/{name}: {e}"))
}

/// [`resolve`] with the files' contents given (or why they are missing).
pub fn resolve_in(spec: &str, passwd: Result<String, String>, group: Result<String, String>) -> Result<Creds, String> {
    let fail = |why: String| format!("cannot run as user {spec:?}: {why}");
    let (user, group_arg) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    if user.is_empty() || group_arg.is_some_and(str::is_empty) {
        return Err(fail("expected user or user:group".into()));
    }
    let entry = match number(user) {
        Some(uid) => passwd.as_deref().ok().and_then(|p| passwd_entries(p).find(|e| e.uid == uid)),
        None => {
            let p = passwd.as_deref().map_err(|e| fail(format!("{e}, so the name cannot be looked up")))?;
            Some(passwd_entries(p).find(|e| e.name == user).ok_or_else(|| fail(format!("no user {user:?} in the sandbox's /etc/passwd")))?)
        }
    };
    let uid = match number(user) {
        Some(uid) => uid,
        None => entry.as_ref().map_or(0, |e| e.uid),
    };
    let mut gid = entry.as_ref().map_or(0, |e| e.gid);
    let mut groups = Vec::new();
    match group_arg {
        Some(g) => {
            gid = match number(g) {
                Some(gid) => gid,
                None => {
                    let text = group.as_deref().map_err(|e| fail(format!("{e}, so the group cannot be looked up")))?;
                    group_entries(text).find(|e| e.name == g).ok_or_else(|| fail(format!("no group {g:?} in the sandbox's /etc/group")))?.gid
                }
            };
        }
        None => {
            // The groups that list the user as a member, as `login` would.
            if let (Some(e), Ok(text)) = (&entry, group.as_deref()) {
                groups = group_entries(text).filter(|g| g.members.split(',').any(|m| m == e.name)).map(|g| g.gid).collect();
                groups.sort_unstable();
                groups.dedup();
            }
        }
    }
    for (what, id) in [("uid", uid), ("gid", gid)].into_iter().chain(groups.iter().map(|g| ("group", *g))) {
        if id >= IDS {
            return Err(fail(format!("{what} {id} is outside the sandbox's ids (0-{})", IDS - 1)));
        }
    }
    let home = entry.map(|e| e.home.to_owned()).filter(|h| h.starts_with('/')).unwrap_or_else(|| "/".to_owned());
    Ok(Creds { uid, gid, groups, home })
}

/// A decimal id, or `None` for a name. Too large a number is kept as
/// [`IDS`] so the range check refuses it.
fn number(s: &str) -> Option<u32> {
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.parse::<u32>().unwrap_or(IDS))
}

struct PasswdEntry<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
    home: &'a str,
}

struct GroupEntry<'a> {
    name: &'a str,
    gid: u32,
    members: &'a str,
}

/// The well-formed lines of `/etc/passwd` (`name:x:uid:gid:gecos:home:shell`).
fn passwd_entries(text: &str) -> impl Iterator<Item = PasswdEntry<'_>> {
    text.lines().filter_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 6 || f[0].is_empty() {
            return None;
        }
        Some(PasswdEntry { name: f[0], uid: f[2].parse().ok()?, gid: f[3].parse().ok()?, home: f[5] })
    })
}

/// The well-formed lines of `/etc/group` (`name:x:gid:member,member`).
fn group_entries(text: &str) -> impl Iterator<Item = GroupEntry<'_>> {
    text.lines().filter_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 3 || f[0].is_empty() {
            return None;
        }
        Some(GroupEntry { name: f[0], gid: f[2].parse().ok()?, members: f.get(3).copied().unwrap_or("") })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nbad line\napp:x:1000:1001:App:/home/app:/bin/sh\nnobody:x:65534:65534::/nonexistent:/bin/false\nhuge:x:70000:70000::/:/bin/sh\n";
    const GROUP: &str = "root:x:0:\napp:x:1001:\nstaff:x:50:app,other\nwheel:x:10:other\n";

    fn ok(s: &str) -> Result<String, String> {
        Ok(s.to_owned())
    }

    fn creds(uid: u32, gid: u32, groups: &[u32], home: &str) -> Creds {
        Creds { uid, gid, groups: groups.to_vec(), home: home.into() }
    }

    #[test]
    fn names_and_numbers_resolve_as_container_runtimes_do() {
        let r = |spec: &str| resolve_in(spec, ok(PASSWD), ok(GROUP));
        assert_eq!(r("app"), Ok(creds(1000, 1001, &[50], "/home/app")), "primary group and memberships from the files");
        assert_eq!(r("1000"), Ok(creds(1000, 1001, &[50], "/home/app")), "a uid with an entry takes its group and home");
        assert_eq!(r("1000:1000"), Ok(creds(1000, 1000, &[], "/home/app")), "an explicit group replaces them");
        assert_eq!(r("app:staff"), Ok(creds(1000, 50, &[], "/home/app")));
        assert_eq!(r("0"), Ok(creds(0, 0, &[], "/root")));
        assert_eq!(r("4242"), Ok(creds(4242, 0, &[], "/")), "a uid without an entry: group 0, home /");
        assert_eq!(r("4242:4242"), Ok(creds(4242, 4242, &[], "/")));
        // Numbers need no files at all.
        assert_eq!(resolve_in("1000:1000", Err("/etc/passwd: gone".into()), Err("/etc/group: gone".into())), Ok(creds(1000, 1000, &[], "/")));
    }

    #[test]
    fn what_cannot_resolve_is_one_line_naming_it() {
        let r = |spec: &str| resolve_in(spec, ok(PASSWD), ok(GROUP)).unwrap_err();
        let e = r("ghost");
        assert!(e.contains("\"ghost\"") && e.contains("/etc/passwd") && !e.contains('\n'), "{e}");
        let e = r("app:ghosts");
        assert!(e.contains("\"ghosts\"") && e.contains("/etc/group"), "{e}");
        assert!(r("huge").contains("outside the sandbox's ids"), "an entry past the id range");
        assert!(r("65536").contains("outside"));
        assert!(r("99999999999999").contains("outside"));
        assert!(r("app:").contains("expected"));
        let e = resolve_in("app", Err("/etc/passwd: No such file or directory".into()), ok(GROUP)).unwrap_err();
        assert!(e.contains("/etc/passwd: No such file") && !e.contains('\n'), "{e}");
    }
}
