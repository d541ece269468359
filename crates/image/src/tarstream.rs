//! Reading a tar stream entry by entry.
//!
//! The `tar` crate reads an entry's extension headers (a GNU long name, PAX
//! records) into memory whatever size they declare, fills a GNU sparse
//! file's holes with zeros, and does not decode PAX sparse files at all
//! (an entry stored as `GNUSparseFile.N/name` holding its map). An image's
//! archive is untrusted and a sparse file's holes must stay holes, so the
//! stream is read here, with the crate's header type for the fixed fields:
//! extension headers are bounded, and every sparse format comes out as one
//! map of data chunks.
//!
//! Understood: v7, ustar, GNU (long names `L` and `K`, old sparse files
//! `S` with their extension blocks) and PAX (`x` records `path`,
//! `linkpath`, `size`, `uid`, `gid`, `mtime`, `SCHILY.xattr.*`, and GNU
//! tar's sparse formats 0.0, 0.1 and 1.0). A global PAX header (`g`) is
//! passed on as an entry of its own, to be ignored.

use std::io::{self, Read};

use tar::{EntryType, GnuExtSparseHeader, GnuSparseHeader, Header};

const BLOCK: u64 = 512;
/// The largest extension header (a long name, PAX records) read into
/// memory.
pub(super) const MAX_EXTENSION: u64 = 1 << 20;
/// The most data chunks a sparse file's map may list.
pub(super) const MAX_SPARSE_CHUNKS: usize = 1 << 20;
/// The PAX record prefix of an extended attribute.
const XATTR_PREFIX: &[u8] = b"SCHILY.xattr.";

/// Where a sparse file's data goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Sparse {
    /// The file's size, holes included.
    pub real_size: u64,
    /// `(offset, length)` of each chunk of data, in order and apart; the
    /// entry's data is their concatenation. The rest of the file is holes.
    pub map: Vec<(u64, u64)>,
}

/// One member of the archive, its extension headers applied.
#[derive(Debug)]
pub(super) struct TarEntry {
    /// The member's own header (its type, mode and device numbers).
    pub header: Header,
    pub path: Vec<u8>,
    pub link: Option<Vec<u8>>,
    /// Bytes of data the archive holds for it (a sparse file's: its
    /// chunks').
    pub size: u64,
    pub sparse: Option<Sparse>,
    /// Extended attributes, from `SCHILY.xattr.NAME` records.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    uid: Option<u64>,
    gid: Option<u64>,
    mtime: Option<(i64, i64)>,
}

impl TarEntry {
    pub(super) fn kind(&self) -> EntryType {
        self.header.entry_type()
    }

    pub(super) fn uid(&self) -> io::Result<u64> {
        self.uid.map_or_else(|| self.header.uid(), Ok)
    }

    pub(super) fn gid(&self) -> io::Result<u64> {
        self.gid.map_or_else(|| self.header.gid(), Ok)
    }

    /// Seconds and nanoseconds (a PAX `mtime` may have both).
    pub(super) fn mtime(&self) -> io::Result<(i64, i64)> {
        match self.mtime {
            Some(t) => Ok(t),
            None => Ok((i64::try_from(self.header.mtime()?).unwrap_or(i64::MAX), 0)),
        }
    }
}

/// A tar stream, read one entry at a time.
#[derive(Debug)]
pub(super) struct TarStream<R> {
    inner: R,
    /// Data of the current entry not read yet.
    left: u64,
    /// Padding after it, up to the next block.
    pad: u64,
}

impl<R: Read> TarStream<R> {
    pub(super) fn new(inner: R) -> Self {
        TarStream { inner, left: 0, pad: 0 }
    }

    /// The stream, positioned after the last entry read (or its end
    /// marker).
    pub(super) fn into_inner(self) -> R {
        self.inner
    }

    /// The next entry; `None` at the end of the archive (a zero block, or
    /// the end of the stream between two entries). What was not read of
    /// the entry before is skipped.
    pub(super) fn next_entry(&mut self) -> io::Result<Option<TarEntry>> {
        self.skip(self.left + self.pad)?;
        (self.left, self.pad) = (0, 0);
        let (mut long_name, mut long_link, mut pax) = (None, None, None);
        loop {
            let Some(header) = self.header()? else {
                if long_name.is_some() || long_link.is_some() || pax.is_some() {
                    return Err(bad("an extension header is not followed by the entry it describes"));
                }
                return Ok(None);
            };
            let slot = match header.entry_type() {
                EntryType::GNULongName => &mut long_name,
                EntryType::GNULongLink => &mut long_link,
                EntryType::XHeader => &mut pax,
                _ => return self.member(header, long_name, long_link, pax.as_deref()).map(Some),
            };
            if slot.is_some() {
                return Err(bad("two extension headers of the same kind describe one entry"));
            }
            *slot = Some(self.extension(&header)?);
        }
    }

    /// The current entry's data (what [`TarStream::next_entry`] says its
    /// `size` is).
    pub(super) fn data(&mut self) -> EntryData<'_, R> {
        EntryData { stream: self }
    }

    /// Reads a header block: `None` at the end of the archive.
    fn header(&mut self) -> io::Result<Option<Header>> {
        let mut header = Header::new_old();
        let buf = header.as_mut_bytes();
        let mut got = 0;
        while got < buf.len() {
            match self.inner.read(&mut buf[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the archive ends inside a header")),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if buf.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        let sum: u32 = buf[..148].iter().chain(&buf[156..]).map(|&b| u32::from(b)).sum::<u32>() + 8 * u32::from(b' ');
        if header.cksum()? != sum {
            return Err(bad("a header's checksum does not match"));
        }
        Ok(Some(header))
    }

    /// Reads an extension header's data (at most [`MAX_EXTENSION`] bytes)
    /// and its padding.
    fn extension(&mut self, header: &Header) -> io::Result<Vec<u8>> {
        let size = header.entry_size()?;
        if size > MAX_EXTENSION {
            return Err(bad(&format!("an extension header of {size} bytes (the limit is {MAX_EXTENSION})")));
        }
        let mut data = Vec::new();
        (&mut self.inner).take(size).read_to_end(&mut data)?;
        if data.len() as u64 != size {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the archive ends inside an extension header"));
        }
        self.skip(padding(size))?;
        Ok(data)
    }

    /// Describes the member whose header is `header`, and positions the
    /// stream at its data.
    fn member(
        &mut self,
        header: Header,
        long_name: Option<Vec<u8>>,
        long_link: Option<Vec<u8>>,
        pax: Option<&[u8]>,
    ) -> io::Result<TarEntry> {
        let pax = match pax {
            Some(data) => Pax::parse(data)?,
            None => Pax::default(),
        };
        let path = match (pax.sparse_name, pax.path, long_name) {
            (Some(name), _, _) | (None, Some(name), _) => name.to_vec(),
            (None, None, Some(long)) => strip_nul(long),
            (None, None, None) => header.path_bytes().into_owned(),
        };
        let link = match (pax.linkpath, long_link) {
            (Some(link), _) => Some(link.to_vec()),
            (None, Some(long)) => Some(strip_nul(long)),
            (None, None) => header.link_name_bytes().map(|l| l.into_owned()),
        };
        let size = match pax.size {
            Some(size) => size,
            None => header.entry_size()?,
        };
        (self.left, self.pad) = (size, padding(size));
        let mut entry = TarEntry {
            path,
            link,
            size,
            sparse: None,
            xattrs: pax.xattrs,
            uid: pax.uid,
            gid: pax.gid,
            mtime: pax.mtime,
            header,
        };
        if entry.kind() == EntryType::GNUSparse {
            entry.sparse = Some(self.gnu_sparse_map(&entry.header)?);
        } else if pax.sparse_major == Some(1) {
            // Format 1.0: the map is at the start of the data.
            let real_size = pax.real_size.ok_or_else(|| bad("a PAX sparse entry without GNU.sparse.realsize"))?;
            let map = self.data_sparse_map()?;
            entry.size = self.left;
            entry.sparse = Some(Sparse { real_size, map });
        } else if let Some(map) = pax.sparse_map {
            // Formats 0.0 and 0.1: the map is in the records.
            let real_size = pax.real_size.ok_or_else(|| bad("a PAX sparse entry without GNU.sparse.size"))?;
            if pax.sparse_blocks.is_some_and(|n| n != map.len() as u64) {
                return Err(bad("a PAX sparse entry's GNU.sparse.numblocks differs from its map"));
            }
            entry.sparse = Some(Sparse { real_size, map });
        }
        if let Some(sparse) = &entry.sparse {
            check_map(sparse, entry.size)?;
        }
        Ok(entry)
    }

    /// The map of an old GNU sparse entry: in its header, then in as many
    /// extension blocks as it says follow.
    fn gnu_sparse_map(&mut self, header: &Header) -> io::Result<Sparse> {
        let gnu = header.as_gnu().ok_or_else(|| bad("a sparse entry without a GNU header"))?;
        let mut map = Vec::new();
        add_chunks(&mut map, &gnu.sparse)?;
        let mut extended = gnu.is_extended();
        while extended {
            let mut ext = GnuExtSparseHeader::new();
            self.inner.read_exact(ext.as_mut_bytes()).map_err(|e| eof_as(e, "the archive ends inside a sparse map"))?;
            add_chunks(&mut map, ext.sparse())?;
            extended = ext.is_extended();
        }
        Ok(Sparse { real_size: gnu.real_size()?, map })
    }

    /// Reads a PAX 1.0 sparse map from the start of the data: decimal
    /// numbers, one a line (the count, then an offset and a length for
    /// each chunk), padded to a block.
    fn data_sparse_map(&mut self) -> io::Result<Vec<(u64, u64)>> {
        let mut numbers: Vec<u64> = Vec::new();
        let mut want: Option<usize> = None;
        let mut current: Option<u64> = None;
        let mut block = [0u8; BLOCK as usize];
        loop {
            if self.left < BLOCK {
                return Err(bad("a PAX sparse entry's map runs past its data"));
            }
            self.inner.read_exact(&mut block).map_err(|e| eof_as(e, "the archive ends inside a sparse map"))?;
            self.left -= BLOCK;
            for &b in &block {
                match b {
                    b'0'..=b'9' => {
                        let n = current.unwrap_or(0).checked_mul(10).and_then(|n| n.checked_add(u64::from(b - b'0')));
                        current = Some(n.ok_or_else(|| bad("a number in a sparse map overflows"))?);
                    }
                    b'\n' => {
                        let n = current.take().ok_or_else(|| bad("an empty line in a sparse map"))?;
                        match want {
                            None => {
                                let chunks = usize::try_from(n).ok().filter(|&c| c <= MAX_SPARSE_CHUNKS);
                                let chunks = chunks.ok_or_else(|| {
                                    bad(&format!("a sparse map of {n} chunks (the limit is {MAX_SPARSE_CHUNKS})"))
                                })?;
                                want = Some(chunks * 2);
                            }
                            Some(_) => numbers.push(n),
                        }
                    }
                    _ => return Err(bad("a sparse map holds something other than numbers")),
                }
                if want == Some(numbers.len()) {
                    // The rest of this block is padding.
                    return Ok(numbers.chunks_exact(2).map(|c| (c[0], c[1])).collect());
                }
            }
        }
    }

    /// Reads and drops `n` bytes.
    fn skip(&mut self, n: u64) -> io::Result<()> {
        let skipped = io::copy(&mut (&mut self.inner).take(n), &mut io::sink())?;
        if skipped != n {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the archive ends inside an entry"));
        }
        Ok(())
    }
}

/// The data of the current entry of a [`TarStream`].
#[derive(Debug)]
pub(super) struct EntryData<'a, R> {
    stream: &'a mut TarStream<R>,
}

impl<R: Read> Read for EntryData<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let s = &mut *self.stream;
        if s.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = usize::try_from(s.left).map_or(buf.len(), |left| left.min(buf.len()));
        let n = s.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "unreadable archive: it ends inside the entry's data",
            ));
        }
        s.left -= n as u64;
        Ok(n)
    }
}

/// What a PAX extension header says about the entry after it.
#[derive(Debug, Default)]
struct Pax<'a> {
    path: Option<&'a [u8]>,
    linkpath: Option<&'a [u8]>,
    size: Option<u64>,
    uid: Option<u64>,
    gid: Option<u64>,
    mtime: Option<(i64, i64)>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    sparse_name: Option<&'a [u8]>,
    sparse_major: Option<u64>,
    real_size: Option<u64>,
    sparse_blocks: Option<u64>,
    /// Formats 0.0 (offset and numbytes records in turn) and 0.1 (one map
    /// record).
    sparse_map: Option<Vec<(u64, u64)>>,
}

impl<'a> Pax<'a> {
    fn parse(data: &'a [u8]) -> io::Result<Pax<'a>> {
        let mut pax = Pax::default();
        let mut offset: Option<u64> = None;
        for (key, value) in records(data)? {
            match key {
                b"path" => pax.path = Some(value),
                b"linkpath" => pax.linkpath = Some(value),
                b"size" => pax.size = Some(number(key, value)?),
                b"uid" => pax.uid = Some(number(key, value)?),
                b"gid" => pax.gid = Some(number(key, value)?),
                b"mtime" => pax.mtime = Some(time(value)?),
                b"GNU.sparse.name" => pax.sparse_name = Some(value),
                b"GNU.sparse.major" => pax.sparse_major = Some(number(key, value)?),
                b"GNU.sparse.minor" => {}
                b"GNU.sparse.realsize" | b"GNU.sparse.size" => pax.real_size = Some(number(key, value)?),
                b"GNU.sparse.numblocks" => pax.sparse_blocks = Some(number(key, value)?),
                b"GNU.sparse.offset" => {
                    if offset.replace(number(key, value)?).is_some() {
                        return Err(bad("two GNU.sparse.offset records without a GNU.sparse.numbytes"));
                    }
                }
                b"GNU.sparse.numbytes" => {
                    let off =
                        offset.take().ok_or_else(|| bad("a GNU.sparse.numbytes record without a GNU.sparse.offset"))?;
                    push_chunk(pax.sparse_map.get_or_insert_with(Vec::new), off, number(key, value)?)?;
                }
                b"GNU.sparse.map" => {
                    let map = pax.sparse_map.get_or_insert_with(Vec::new);
                    let fields: Vec<&[u8]> = value.split(|&b| b == b',').filter(|f| !f.is_empty()).collect();
                    if !fields.len().is_multiple_of(2) {
                        return Err(bad("GNU.sparse.map has an odd count of numbers"));
                    }
                    for pair in fields.chunks_exact(2) {
                        push_chunk(map, number(key, pair[0])?, number(key, pair[1])?)?;
                    }
                }
                _ => {
                    if let Some(name) = key.strip_prefix(XATTR_PREFIX) {
                        pax.xattrs.push((name.to_vec(), value.to_vec()));
                    }
                }
            }
        }
        if offset.is_some() {
            return Err(bad("a GNU.sparse.offset record without a GNU.sparse.numbytes"));
        }
        Ok(pax)
    }
}

/// The records of PAX extension data: `LEN KEY=VALUE\n`, where LEN counts
/// the whole record, so a value may hold any byte (a newline too).
fn records(mut data: &[u8]) -> io::Result<Vec<(&[u8], &[u8])>> {
    let mut out = Vec::new();
    // Some writers pad the data with NULs.
    while data.first().is_some_and(|&b| b != 0) {
        let malformed = || bad("a malformed PAX record");
        let space = data.iter().position(|&b| b == b' ').ok_or_else(malformed)?;
        let len: usize = std::str::from_utf8(&data[..space]).ok().and_then(|l| l.parse().ok()).ok_or_else(malformed)?;
        if len <= space + 1 || len > data.len() {
            return Err(malformed());
        }
        let record = data[space + 1..len].strip_suffix(b"\n").ok_or_else(malformed)?;
        let eq = record.iter().position(|&b| b == b'=').ok_or_else(malformed)?;
        out.push((&record[..eq], &record[eq + 1..]));
        data = &data[len..];
    }
    Ok(out)
}

fn number(key: &[u8], value: &[u8]) -> io::Result<u64> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| bad(&format!("the PAX record {} is not a number", String::from_utf8_lossy(key))))
}

/// A PAX time: seconds, maybe negative, maybe with a fraction.
fn time(value: &[u8]) -> io::Result<(i64, i64)> {
    let text = std::str::from_utf8(value).map_err(|_| bad("the PAX record mtime is not a time"))?;
    let (secs, frac) = text.split_once('.').unwrap_or((text, ""));
    let secs: i64 = secs.parse().map_err(|_| bad("the PAX record mtime is not a time"))?;
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("the PAX record mtime is not a time"));
    }
    let digits: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
    let mut nsec: i64 = digits.parse().unwrap_or(0);
    // -1.5 is half a second before -1.
    let secs = if text.starts_with('-') && nsec > 0 {
        nsec = 1_000_000_000 - nsec;
        secs - 1
    } else {
        secs
    };
    Ok((secs, nsec))
}

fn add_chunks(map: &mut Vec<(u64, u64)>, chunks: &[GnuSparseHeader]) -> io::Result<()> {
    for chunk in chunks.iter().filter(|c| !c.is_empty()) {
        push_chunk(map, chunk.offset()?, chunk.length()?)?;
    }
    Ok(())
}

fn push_chunk(map: &mut Vec<(u64, u64)>, offset: u64, len: u64) -> io::Result<()> {
    if map.len() >= MAX_SPARSE_CHUNKS {
        return Err(bad(&format!("a sparse map of more than {MAX_SPARSE_CHUNKS} chunks")));
    }
    map.push((offset, len));
    Ok(())
}

/// Checks that a sparse map's chunks are in order, apart, within the
/// file, and hold exactly the entry's data.
fn check_map(sparse: &Sparse, data: u64) -> io::Result<()> {
    let (mut end, mut sum) = (0u64, 0u64);
    for &(offset, len) in &sparse.map {
        if offset < end {
            return Err(bad("a sparse map's chunks overlap or are out of order"));
        }
        end = offset
            .checked_add(len)
            .filter(|&e| e <= sparse.real_size)
            .ok_or_else(|| bad("a sparse map's chunk ends past the file's size"))?;
        sum += len;
    }
    if sum != data {
        return Err(bad(&format!("a sparse map lists {sum} bytes of data, and the entry holds {data}")));
    }
    Ok(())
}

fn padding(size: u64) -> u64 {
    (BLOCK - size % BLOCK) % BLOCK
}

/// A GNU long name or link, without the NUL that ends it.
fn strip_nul(mut name: Vec<u8>) -> Vec<u8> {
    if name.last() == Some(&0) {
        name.pop();
    }
    name
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}

fn eof_as(e: io::Error, msg: &str) -> io::Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        io::Error::new(io::ErrorKind::UnexpectedEof, msg.to_owned())
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pax_records_may_hold_newlines_and_any_byte() {
        let value = b"a\nb\0c";
        let record = |k: &str, v: &[u8]| {
            let body = [k.as_bytes(), b"=", v, b"\n"].concat();
            // The length counts its own digits.
            let mut len = body.len() + 2;
            while len.to_string().len() + 1 + body.len() != len {
                len = len.to_string().len() + 1 + body.len();
            }
            [format!("{len} ").into_bytes(), body].concat()
        };
        let data = [record("SCHILY.xattr.user.x", value), record("path", b"p")].concat();
        let pax = Pax::parse(&data).unwrap();
        assert_eq!(pax.xattrs, vec![(b"user.x".to_vec(), value.to_vec())]);
        assert_eq!(pax.path, Some(&b"p"[..]));
        assert!(records(b"99 path=x\n").is_err(), "a length past the data");
        assert!(records(b"4 p=x\n").is_err(), "a length short of the record");
        assert_eq!(records(b"5 p=\n").unwrap(), vec![(&b"p"[..], &b""[..])]);
    }

    #[test]
    fn pax_times_keep_their_fraction() {
        assert_eq!(time(b"1600000000").unwrap(), (1_600_000_000, 0));
        assert_eq!(time(b"1600000000.25").unwrap(), (1_600_000_000, 250_000_000));
        assert_eq!(time(b"-1.5").unwrap(), (-2, 500_000_000));
        assert!(time(b"soon").is_err() && time(b"1.x").is_err());
    }

    #[test]
    fn sparse_maps_must_be_ordered_inside_the_file_and_match_the_data() {
        let sparse = |map: Vec<(u64, u64)>| Sparse { real_size: 100, map };
        check_map(&sparse(vec![(0, 10), (50, 10), (100, 0)]), 20).unwrap();
        assert!(check_map(&sparse(vec![(50, 10), (0, 10)]), 20).is_err());
        assert!(check_map(&sparse(vec![(0, 10), (5, 10)]), 20).is_err());
        assert!(check_map(&sparse(vec![(95, 10)]), 10).is_err());
        assert!(check_map(&sparse(vec![(0, 10)]), 11).is_err());
        assert!(check_map(&sparse(vec![(u64::MAX, 2)]), 2).is_err());
    }
}
