//! A directory's names, read from its descriptor.

use std::ffi::CString;
use std::io;
use std::os::fd::AsFd;

/// The names in a directory but `.` and `..`, sorted by bytes. Reads from a
/// fresh descriptor of `.`, so the caller's file offset does not matter.
pub fn read_dir(dir: impl AsFd) -> io::Result<Vec<CString>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let b = name.to_bytes();
        if b != b"." && b != b".." {
            names.push(name.to_owned());
        }
    }
    names.sort_unstable();
    Ok(names)
}
