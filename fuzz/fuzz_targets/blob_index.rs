#![no_main]

use cairn_blob::index::{decode, encode};
use cairn_blob::ObjectId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // An index file as the store gives it back: the input is first taken
    // as the stored (zstd) bytes, named by the hash of what they decompress
    // to; then as the JSON inside, compressed here, so the fuzzer reaches
    // the parsing past the hash check.
    let mut inner = Vec::new();
    let decompressed = zstd::stream::read::Decoder::new(data)
        .and_then(|d| std::io::copy(&mut std::io::Read::take(d, 1 << 22), &mut inner))
        .is_ok();
    if decompressed {
        check(&ObjectId::of(&inner), data);
    }
    let stored = zstd::bulk::compress(data, 1).expect("zstd into memory");
    check(&ObjectId::of(data), &stored);
});

fn check(id: &ObjectId, stored: &[u8]) {
    let Ok(packs) = decode(id, stored) else { return };
    // Written again, it reads back the same.
    let (id2, stored2) = encode(&packs).expect("a decoded index encodes");
    assert_eq!(decode(&id2, &stored2).expect("an encoded index decodes"), packs);
}
