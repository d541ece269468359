#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::egress::EgressBridge;
use super::*;

#[test]
fn the_init_gets_cairn_the_loader_and_the_libraries_ldd_names() {
    let ldd = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\
               \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
    let files = files_from_ldd(Path::new("/opt/cairn/bin/cairn"), ldd).unwrap();
    let names: Vec<(&str, &str)> = files.iter().map(|(n, p)| (n.as_str(), p.to_str().unwrap())).collect();
    assert_eq!(
        names,
        [
            ("cairn", "/opt/cairn/bin/cairn"),
            ("libgcc_s.so.1", "/lib/x86_64-linux-gnu/libgcc_s.so.1"),
            ("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
            ("ld.so", "/lib64/ld-linux-x86-64.so.2"),
        ]
    );
    // A static binary has no loader to run it with.
    let err = files_from_ldd(Path::new("/x/cairn"), "\tnot a dynamic executable\n").unwrap_err();
    assert!(err.contains("cannot find the dynamic loader"), "{err}");
}

/// The host side of a gvisor sandbox's egress: a connection to the unix
/// socket reaches the proxy's listener (in a namespace of the bridge's own)
/// with its bytes both ways; ending the connections waits for the sandbox's
/// side to close, and says so when it does not. Needs root (unshare).
#[test]
fn the_egress_bridge_carries_bytes_both_ways_and_ends_connections() {
    assert!(nix::unistd::geteuid().is_root(), "the bridge makes a network namespace: run as root");
    let dir = tempfile::tempdir().unwrap();
    let (bridge, proxy) = EgressBridge::start(dir.path(), "egress.sock").unwrap();
    assert_eq!(proxy.local_addr().unwrap(), crate::net::PROXY_ADDR);
    crate::net::check_proxy_listener(&proxy).unwrap();

    let mut sandbox = UnixStream::connect(dir.path().join("egress.sock")).unwrap();
    sandbox.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (mut upstream, _) = proxy.accept().unwrap();
    sandbox.write_all(b"CONNECT example.com:443").unwrap();
    let mut got = [0u8; 23];
    upstream.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"CONNECT example.com:443");
    upstream.write_all(b"200").unwrap();
    let mut back = [0u8; 3];
    sandbox.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"200");

    // The sandbox's side keeps its socket open: ending fails in time...
    assert!(!bridge.end_connections(Duration::from_millis(200)), "a connection still open counts");
    // ...and once it reads the end and closes, as the init does, it succeeds.
    let mut rest = Vec::new();
    sandbox.read_to_end(&mut rest).unwrap();
    drop(sandbox);
    assert!(bridge.end_connections(Duration::from_secs(2)), "the closed connection is gone");

    // A new bridge over the same directory replaces the socket: the old
    // one, dropped, leaves it alone; the new one removes it.
    let (newer, _proxy2) = EgressBridge::start(dir.path(), "egress.sock").unwrap();
    drop(bridge);
    assert!(dir.path().join("egress.sock").exists(), "the old bridge removed the new one's socket");
    UnixStream::connect(dir.path().join("egress.sock")).expect("the new bridge answers");
    drop(newer);
    assert!(!dir.path().join("egress.sock").exists(), "the socket is removed with its bridge");
}
