#![no_main]

use cairn_blob::pack::{decode_chunk, parse_trailer, PackBuilder};
use cairn_blob::ObjectId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A pack as the store gives it back.
    let Ok(entries) = parse_trailer(data) else { return };
    let mut chunks = Vec::new();
    for e in &entries {
        // The trailer's checks keep every entry inside the pack's data.
        let end = e.offset.checked_add(u64::from(e.length)).expect("entry end overflows");
        assert!(end <= data.len() as u64, "entry {} past the pack", e.id);
        let stored = &data[e.offset as usize..end as usize];
        if let Ok(chunk) = decode_chunk(e, stored) {
            assert_eq!(chunk.len(), e.raw_length as usize);
            assert_eq!(ObjectId::of(&chunk), e.id);
            chunks.push(chunk);
        }
    }
    // The chunks that decoded, packed again, read back as themselves.
    let mut builder = PackBuilder::new().expect("a pack builder");
    for c in &chunks {
        builder.add(ObjectId::of(c), c).expect("a chunk of a pack fits a pack");
    }
    let Some(pack) = builder.finish() else { return };
    let again = parse_trailer(&pack.data).expect("a built pack parses");
    assert_eq!(again, pack.entries);
    for (e, c) in again.iter().zip(&chunks) {
        let stored = &pack.data[e.offset as usize..(e.offset + u64::from(e.length)) as usize];
        assert_eq!(&decode_chunk(e, stored).expect("a built chunk decodes"), c);
    }
});
