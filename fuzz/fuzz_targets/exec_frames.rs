#![no_main]

use std::io::Write;
use std::os::unix::net::UnixStream;

use cairn_sandbox::proto::{recv, Reply, Request};
use cairn_sandbox::CommandConnection;
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Bytes fed to a socket at once: what its buffer takes without a reader.
const MAX_INPUT: usize = 64 * 1024;

/// A connection whose peer wrote `data` and closed.
fn fed(data: &[u8]) -> UnixStream {
    let (mut theirs, ours) = UnixStream::pair().expect("a socket pair");
    theirs.write_all(data).expect("the socket buffer takes the input");
    drop(theirs);
    ours
}

fuzz_target!(|data: &[u8]| {
    let data = &data[..data.len().min(MAX_INPUT)];
    // The init's side: requests, frame after frame, until the end or an
    // error. Each one decoded serialises and parses back to itself.
    frames::<Request>(data);
    // The daemon's side: replies.
    frames::<Reply>(data);
    // A command's connection tells its end the same whether it blocks
    // (`wait`) or is polled (`try_exit`), whatever came on it.
    let waited = CommandConnection::new(fed(data)).wait().ok().flatten();
    let polled = CommandConnection::new(fed(data)).try_exit().expect("reading a closed socket");
    assert_eq!(waited, polled);
});

fn frames<T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug>(data: &[u8]) {
    let conn = fed(data);
    while let Ok(Some((msg, fds))) = recv::<T>(&conn) {
        assert!(fds.is_empty(), "descriptors from nowhere");
        let json = serde_json::to_vec(&msg).expect("a frame serialises");
        let back: T = serde_json::from_slice(&json).expect("a frame parses back");
        assert_eq!(back, msg);
    }
}
