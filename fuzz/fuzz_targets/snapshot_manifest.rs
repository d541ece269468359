#![no_main]

use cairn_blob::ObjectId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A manifest as the store gives it back: its JSON, or (when the input
    // starts with the zstd magic) the stored, compressed form.
    let json = if data.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        let mut out = Vec::new();
        match zstd::stream::read::Decoder::new(data).and_then(|d| std::io::copy(&mut std::io::Read::take(d, 1 << 22), &mut out)) {
            Ok(_) => out,
            Err(_) => return,
        }
    } else {
        data.to_vec()
    };
    let id = ObjectId::of(&json);
    // The other two stored forms: a format-2 manifest object and a segment.
    if let Ok(root) = cairn_snapshot::decode_root(&id, &json) {
        assert_eq!(root.version, cairn_snapshot::VERSION);
    }
    let _ = cairn_snapshot::decode_segment(&id, &json);
    let Ok(m) = cairn_snapshot::decode(&id, &json) else { return };
    let valid = m.validate().is_ok();
    let _ = cairn_snapshot::referenced_chunks(&m);
    let _ = m.file_count();
    // Stored again, it reads back the same, and its encoding is canonical:
    // encoding what was read back gives the same bytes (so the same id).
    let encoded = cairn_snapshot::encode(&m).expect("a decoded manifest encodes");
    let again = cairn_snapshot::decode(&ObjectId::of(&encoded), &encoded).expect("an encoded manifest decodes");
    assert_eq!(again, m);
    assert_eq!(cairn_snapshot::encode(&again).expect("encodes"), encoded);
    assert_eq!(again.validate().is_ok(), valid);
});
