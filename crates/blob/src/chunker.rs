//! Content-defined chunking (FastCDC): boundaries follow the content, so an
//! insertion early in a file does not change every later chunk's id.

use std::io::Read;

use fastcdc::v2020::FastCDC;

use crate::Error;

/// Smallest, average and largest chunk sizes.
pub const MIN_CHUNK: usize = 64 * 1024;
pub const AVG_CHUNK: usize = 256 * 1024;
pub const MAX_CHUNK: usize = 1024 * 1024;

/// The streaming buffer: several chunks long, so that moving the unfinished
/// tail to the front happens once per few chunks, not once per chunk.
const STREAM_BUFFER: usize = 4 * MAX_CHUNK;

/// Splits `data` into content-defined chunks (byte ranges); data shorter than
/// [`MIN_CHUNK`] is one chunk. Empty data yields no chunk.
pub fn chunk_ranges(data: &[u8]) -> Vec<std::ops::Range<usize>> {
    FastCDC::new(data, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK).map(|c| c.offset..c.offset + c.length).collect()
}

/// Reads `reader` to the end, calling `f` with each chunk in order. Uses a
/// bounded buffer (files of any size).
///
/// Returns the number of bytes read. The chunks are exactly those
/// [`chunk_ranges`] finds on the whole content.
pub fn for_each_chunk(reader: &mut dyn std::io::Read, f: &mut dyn FnMut(&[u8]) -> crate::Result<()>) -> crate::Result<u64> {
    // Reserved, not zeroed: most files are small, and zeroing the whole
    // buffer for each of them costs more than chunking them.
    let mut buf: Vec<u8> = Vec::with_capacity(STREAM_BUFFER);
    let mut total = 0u64;
    loop {
        let room = (STREAM_BUFFER - buf.len()) as u64;
        let read = reader.take(room).read_to_end(&mut buf).map_err(Error::Input)?;
        let eof = (read as u64) < room;
        let mut consumed = 0;
        for chunk in FastCDC::new(&buf, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK) {
            // FastCDC looks at most MAX_CHUNK bytes ahead of a chunk's start,
            // so a cut with that much data after the start (or at the end of
            // input) is final; anything closer to the buffer's end might
            // move once more data arrives.
            if !eof && buf.len() - chunk.offset < MAX_CHUNK {
                break;
            }
            f(&buf[chunk.offset..chunk.offset + chunk.length])?;
            consumed += chunk.length;
        }
        total += consumed as u64;
        if eof {
            return Ok(total);
        }
        // The buffer was full, so at least STREAM_BUFFER - MAX_CHUNK bytes
        // were consumed: this moves less than one chunk's worth.
        buf.drain(..consumed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::noise;
    use crate::ObjectId;

    fn streamed(data: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut reader = data;
        let n = for_each_chunk(&mut reader, &mut |c| {
            out.push(c.to_vec());
            Ok(())
        })
        .unwrap();
        assert_eq!(n, data.len() as u64);
        out
    }

    #[test]
    fn small_and_empty_inputs() {
        assert!(chunk_ranges(&[]).is_empty());
        assert!(streamed(&[]).is_empty());
        assert_eq!(chunk_ranges(b"abc"), vec![0..3]);
        assert_eq!(streamed(b"abc"), vec![b"abc".to_vec()]);
        let below_min = noise(1, MIN_CHUNK - 1);
        assert_eq!(chunk_ranges(&below_min).len(), 1);
    }

    #[test]
    fn deterministic_bounded_and_streaming_agrees() {
        let data = noise(7, 9 * MAX_CHUNK + 12345);
        let ranges = chunk_ranges(&data);
        assert_eq!(ranges, chunk_ranges(&data));
        assert!(ranges.len() > 10);
        let mut pos = 0;
        for (i, r) in ranges.iter().enumerate() {
            assert_eq!(r.start, pos);
            assert!(r.len() <= MAX_CHUNK);
            if i + 1 < ranges.len() {
                assert!(r.len() >= MIN_CHUNK);
            }
            pos = r.end;
        }
        assert_eq!(pos, data.len());
        let from_ranges: Vec<Vec<u8>> = ranges.iter().map(|r| data[r.clone()].to_vec()).collect();
        assert_eq!(streamed(&data), from_ranges);
    }

    #[test]
    fn streaming_survives_short_reads() {
        struct Trickle<'a>(&'a [u8]);
        impl std::io::Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(self.0.len()).min(7919);
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let data = noise(3, 3 * MAX_CHUNK + 99);
        let mut got = Vec::new();
        for_each_chunk(&mut Trickle(&data), &mut |c| {
            got.push(c.len());
            Ok(())
        })
        .unwrap();
        let want: Vec<usize> = chunk_ranges(&data).iter().map(|r| r.len()).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn an_early_insertion_keeps_later_chunks() {
        let data = noise(11, 8 * MAX_CHUNK);
        let mut edited = data.clone();
        edited.splice(1000..1000, b"an insertion near the start".iter().copied());
        let ids = |d: &[u8]| -> Vec<ObjectId> { chunk_ranges(d).into_iter().map(|r| ObjectId::of(&d[r])).collect() };
        let (before, after) = (ids(&data), ids(&edited));
        let kept = after.iter().filter(|id| before.contains(id)).count();
        assert!(kept + 2 >= before.len(), "only {kept} of {} chunks survived", before.len());
    }

    #[test]
    fn callback_errors_stop_the_walk() {
        let data = noise(5, 3 * MAX_CHUNK);
        let mut calls = 0;
        let err = for_each_chunk(&mut &data[..], &mut |_| {
            calls += 1;
            Err(Error::Writer("stop".into()))
        });
        assert!(err.is_err());
        assert_eq!(calls, 1);
    }
}
