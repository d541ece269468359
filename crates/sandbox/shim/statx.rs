//! `libcairn-statx.so`: preloaded into the commands of a gvisor sandbox
//! whose image has the GNU C library. The runsc of Debian 12 refuses
//! `AT_NO_AUTOMOUNT` (EINVAL) in `statx` and `fstatat`, and GNU coreutils
//! 9 passes it on every `ls` and `stat`. Automounts do not exist in a
//! sandbox, so the flag means nothing there: these wrappers drop it and
//! make the call.
//!
//! Built by the sandbox crate's build script with `rustc` alone (no std,
//! no dependency, `panic=abort`), so it loads into any glibc program.

#![no_std]

use core::ffi::{c_char, c_int, c_long, c_uint, c_void};

extern "C" {
    /// The C library's `syscall(2)`: sets `errno` on failure.
    fn syscall(number: c_long, ...) -> c_long;
}

const AT_NO_AUTOMOUNT: c_int = 0x800;
const SYS_NEWFSTATAT: c_long = 262;
const SYS_STATX: c_long = 332;

#[no_mangle]
pub unsafe extern "C" fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, buf: *mut c_void) -> c_int {
    // SAFETY: the caller's arguments, passed on as the kernel takes them.
    unsafe { syscall(SYS_STATX, dirfd, path, flags & !AT_NO_AUTOMOUNT, mask, buf) as c_int }
}

#[no_mangle]
pub unsafe extern "C" fn fstatat(dirfd: c_int, path: *const c_char, buf: *mut c_void, flags: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { syscall(SYS_NEWFSTATAT, dirfd, path, buf, flags & !AT_NO_AUTOMOUNT) as c_int }
}

#[no_mangle]
pub unsafe extern "C" fn fstatat64(dirfd: c_int, path: *const c_char, buf: *mut c_void, flags: c_int) -> c_int {
    // SAFETY: as above (on x86_64 and aarch64, `stat64` is `stat`).
    unsafe { syscall(SYS_NEWFSTATAT, dirfd, path, buf, flags & !AT_NO_AUTOMOUNT) as c_int }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    loop {}
}
