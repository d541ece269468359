#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Any input must give an answer, never a panic.
    if let Ok(Some(head)) = cairn_egress::parse_request_head(data) {
        assert!(head.head_len <= data.len());
        assert!(head.head_len <= cairn_egress::connect::MAX_HEAD);
        let _ = cairn_egress::host_header_agrees(&head);
    }
});
