#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Any input must give an answer, never a panic; a complete answer must
    // stay the same when more bytes follow (the caller keeps reading).
    if let Ok(Some(hello)) = cairn_egress::parse_client_hello(data) {
        let mut more = data.to_vec();
        more.push(0);
        assert_eq!(cairn_egress::parse_client_hello(&more), Ok(Some(hello)));
    }
});
