//! Importing from tar archives, plain or compressed with gzip or zstd.
//!
//! An archive is untrusted input: every entry's path is validated here and
//! then written by [`TreeWriter`], which resolves it beneath the image root
//! without following symlinks. The first entry that could escape the image
//! (or that this code does not understand) refuses the whole archive. The
//! stream is read by `tarstream`, which bounds extension headers and
//! decodes sparse files (GNU and PAX) into maps, so that holes stay holes.

use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;
use tar::EntryType;

use super::path::{quoted, PathFault, RelPath};
use super::tarstream::{TarEntry, TarStream};
use super::writer::{Content, Meta, TreeWriter, CAPABILITY_XATTR};
use crate::{Error, Result};

/// What an import source is, judged by its content rather than its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Format {
    Directory,
    Tar,
    Gzip,
    Zstd,
}

/// Looks at `src`: a directory, or a file whose first bytes say which kind
/// of archive it is.
pub(super) fn detect(src: &Path) -> Result<Format> {
    let source_err = |msg: String| Error::ImageSource(src.to_owned(), msg);
    let meta = fs::metadata(src).map_err(|e| source_err(e.to_string()))?;
    if meta.is_dir() {
        return Ok(Format::Directory);
    }
    if !meta.is_file() {
        return Err(source_err("not a directory or a regular file".into()));
    }
    let mut head = Vec::with_capacity(512);
    File::open(src).and_then(|f| f.take(512).read_to_end(&mut head)).map_err(|e| source_err(e.to_string()))?;
    sniff(&head).map_err(|msg| source_err(msg.into()))
}

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

fn sniff(head: &[u8]) -> Result<Format, &'static str> {
    const XZ: &[u8] = &[0xfd, b'7', b'z', b'X', b'Z', 0];
    const BZIP2: &[u8] = b"BZh";
    if head.starts_with(GZIP_MAGIC) {
        Ok(Format::Gzip)
    } else if head.starts_with(ZSTD_MAGIC) {
        Ok(Format::Zstd)
    } else if head.starts_with(XZ) || head.starts_with(BZIP2) {
        Err("xz and bzip2 archives are not supported; use a plain, gzip or zstd tar archive")
    } else if is_tar_header(head) {
        Ok(Format::Tar)
    } else {
        Err("not a directory or a tar archive (plain, gzip or zstd)")
    }
}

/// Every tar flavour (v7, ustar, GNU, PAX) starts with a 512-byte header
/// whose checksum field holds the sum of the header's bytes, counting the
/// field itself as spaces. That identifies tar even without ustar's magic.
fn is_tar_header(head: &[u8]) -> bool {
    const CKSUM: std::ops::Range<usize> = 148..156;
    let Some(header) = head.get(..512) else { return false };
    let sum: u32 =
        header.iter().enumerate().map(|(i, &b)| if CKSUM.contains(&i) { u32::from(b' ') } else { u32::from(b) }).sum();
    parse_octal(&header[CKSUM]) == Some(sum)
}

/// A tar numeric field: optional leading spaces, octal digits, then a NUL
/// or space terminator.
fn parse_octal(field: &[u8]) -> Option<u32> {
    let digits: String =
        field.iter().skip_while(|&&b| b == b' ').take_while(|b| b.is_ascii_digit()).map(|&b| b as char).collect();
    u32::from_str_radix(&digits, 8).ok()
}

/// Unpacks archive `src` of the given format into the writer's tree.
pub(super) fn unpack(src: &Path, format: Format, w: &mut TreeWriter, tracked: &crate::progress::Tracked) -> Result<()> {
    let source_err = |e: io::Error| Error::ImageSource(src.to_owned(), e.to_string());
    let file = File::open(src).map_err(source_err)?;
    if let Ok(meta) = file.metadata() {
        tracked.source(meta.len());
    }
    let file = BufReader::new(tracked.reader(file));
    match format {
        Format::Tar => unpack_from(src, file, w),
        // Multi-member: `cat a.gz b.gz` is a valid gzip stream too.
        Format::Gzip => unpack_from(src, MultiGzDecoder::new(file), w),
        Format::Zstd => unpack_from(src, zstd::stream::read::Decoder::with_buffer(file).map_err(source_err)?, w),
        Format::Directory => Err(Error::ImageSource(src.to_owned(), "is a directory, not an archive".into())),
    }
}

fn unpack_from<R: Read>(src: &Path, reader: R, w: &mut TreeWriter) -> Result<()> {
    unpack_tar(src, &mut TarStream::new(reader), w)
}

fn unpack_tar<R: Read>(src: &Path, stream: &mut TarStream<R>, w: &mut TreeWriter) -> Result<()> {
    let corrupt = |e: io::Error| Error::ImageSource(src.to_owned(), format!("unreadable archive: {e}"));
    while let Some(entry) = stream.next_entry().map_err(corrupt)? {
        unpack_entry(src, &entry, &mut stream.data(), w)?;
    }
    Ok(())
}

/// The sha256 digests and sizes of a layer as stored (compressed) and as
/// unpacked (the tar stream, whose digest is the layer's diffid), and how
/// it was compressed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct LayerDigests {
    pub blob: String,
    pub blob_bytes: u64,
    pub diff_id: String,
    pub format: Format,
}

/// Unpacks one layer of an OCI image from `blob` (a tar stream compressed
/// as `format` says, or as its first bytes say when `None`) into a layer
/// writer, hashing both the blob and the tar stream as they are read. Both
/// are read to their end, so the digests cover every byte, including what
/// follows the tar's last entry.
pub(super) fn unpack_layer(
    src: &Path,
    blob: impl Read,
    format: Option<Format>,
    w: &mut TreeWriter,
) -> Result<LayerDigests> {
    let source_err = |e: io::Error| Error::ImageSource(src.to_owned(), format!("unreadable layer: {e}"));
    let mut blob = Hashing::new(blob);
    // The first bytes, read (and hashed) ahead to tell the compression.
    let mut head = [0u8; 4];
    let mut head_len = 0;
    if format.is_none() {
        while head_len < head.len() {
            match blob.read(&mut head[head_len..]) {
                Ok(0) => break,
                Ok(n) => head_len += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(source_err(e)),
            }
        }
    }
    let format = format.unwrap_or_else(|| layer_compression(&head[..head_len]));
    let diff_id = {
        let compressed = BufReader::new(io::Cursor::new(&head[..head_len]).chain(&mut blob));
        let tar: Box<dyn Read + '_> = match format {
            Format::Tar => Box::new(compressed),
            Format::Gzip => Box::new(MultiGzDecoder::new(compressed)),
            Format::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(compressed).map_err(source_err)?),
            Format::Directory => return Err(Error::ImageSource(src.to_owned(), "a layer is not a directory".into())),
        };
        let mut archive = TarStream::new(Hashing::new(tar));
        unpack_tar(src, &mut archive, w)?;
        let mut stream = archive.into_inner();
        io::copy(&mut stream, &mut io::sink()).map_err(source_err)?;
        stream.hex()
    };
    io::copy(&mut blob, &mut io::sink()).map_err(source_err)?;
    Ok(LayerDigests { blob: blob.hex(), blob_bytes: blob.bytes, diff_id, format })
}

/// How a layer whose media type is not known is compressed, from its
/// first bytes: gzip or zstd by their magic, else a plain tar (whose first
/// block may be all zeros: an empty layer).
fn layer_compression(head: &[u8]) -> Format {
    if head.starts_with(GZIP_MAGIC) {
        Format::Gzip
    } else if head.starts_with(ZSTD_MAGIC) {
        Format::Zstd
    } else {
        Format::Tar
    }
}

/// A reader that hashes (sha256) and counts what passes through it.
pub(super) struct Hashing<R> {
    inner: R,
    hasher: sha2::Sha256,
    pub bytes: u64,
}

impl<R> Hashing<R> {
    pub(super) fn new(inner: R) -> Self {
        Hashing { inner, hasher: sha2::Sha256::default(), bytes: 0 }
    }

    /// The digest so far, as `sha256:<hex>`.
    pub(super) fn hex(&self) -> String {
        use sha2::Digest;
        format!("sha256:{}", hex::encode(self.hasher.clone().finalize()))
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use sha2::Digest;
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// Writes one entry, whose data `data` reads. Long names (GNU and PAX),
/// PAX owners, sizes and times and sparse maps are already applied to it.
fn unpack_entry(src: &Path, entry: &TarEntry, data: &mut dyn Read, w: &mut TreeWriter) -> Result<()> {
    let raw = &entry.path;
    let name = String::from_utf8_lossy(raw).into_owned();
    // Errors name the entry as the archive spells it.
    let refuse = |reason: &'static str| Error::UnsafeEntry { entry: name.clone(), reason };
    let path = RelPath::parse(raw).map_err(|fault| refuse(path_reason(fault)))?;
    let link_target = || entry.link.clone().filter(|l| !l.is_empty()).ok_or_else(|| refuse("link without a target"));

    let kind = entry.kind();
    if w.is_layer() {
        if let Some(result) = whiteout_entry(&path, raw, kind, w) {
            return result.map_err(|e| match e {
                Error::UnsafeEntry { reason, .. } => refuse(reason),
                e => e,
            });
        }
    }
    let result = match kind {
        // Old tars mark directories only with a trailing slash.
        EntryType::Regular if raw.ends_with(b"/") => w.dir(&path, meta(src, &name, entry)?),
        EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
            let meta = meta(src, &name, entry)?;
            let capability = entry.xattrs.iter().find(|(k, _)| k == CAPABILITY_XATTR).map(|(_, v)| v.as_slice());
            let content = Content { size: entry.size, sparse: entry.sparse.as_ref(), capability };
            w.file(&path, meta, content, data)
        }
        EntryType::Directory => w.dir(&path, meta(src, &name, entry)?),
        EntryType::Symlink => {
            let target = link_target()?;
            if target.contains(&0) {
                return Err(refuse("name contains a NUL byte"));
            }
            w.symlink(&path, &target, meta(src, &name, entry)?)
        }
        EntryType::Link => {
            let target = RelPath::parse(&link_target()?).map_err(|fault| refuse(link_reason(fault)))?;
            w.hardlink(&path, &target)
        }
        EntryType::Char | EntryType::Block => {
            w.drop_device(&path);
            Ok(())
        }
        EntryType::Fifo => {
            w.drop_fifo(&path);
            Ok(())
        }
        // Archive-wide PAX defaults (comments, mtimes): nothing to write.
        EntryType::XGlobalHeader => Ok(()),
        _ => Err(refuse("unknown entry type")),
    };
    result.map_err(|e| match e {
        Error::UnsafeEntry { reason, .. } => refuse(reason),
        e => e,
    })
}

/// Whiteout entries of an OCI layer: `D/.wh.NAME` deletes `NAME` of the
/// layers below, `D/.wh..wh..opq` hides everything of theirs in `D`, and
/// other `.wh..wh.` names (AUFS metadata) mean nothing to overlayfs and are
/// skipped. `None` when `path` is no whiteout.
fn whiteout_entry(path: &RelPath, raw: &[u8], kind: EntryType, w: &mut TreeWriter) -> Option<Result<()>> {
    const PREFIX: &[u8] = b".wh.";
    const OPAQUE: &[u8] = b".wh..wh..opq";
    let (_, name) = path.split_last()?;
    let target = name.to_bytes().strip_prefix(PREFIX)?;
    let refuse = |reason| Some(Err(Error::UnsafeEntry { entry: path.to_string(), reason }));
    if kind == EntryType::Directory || raw.ends_with(b"/") {
        return refuse("a whiteout entry is a directory");
    }
    let dir = path.parent();
    if name.to_bytes() == OPAQUE {
        return Some(w.opaque(&dir));
    }
    if target.starts_with(PREFIX) {
        w.skip_meta(path);
        return Some(Ok(()));
    }
    if target.is_empty() || target == b"." || target == b".." {
        return refuse("a whiteout of an empty, '.' or '..' name");
    }
    // No NUL: it is part of a validated component.
    let target = std::ffi::CString::new(target).ok()?;
    Some(w.whiteout(&dir, &target, path))
}

/// Owner, mode and mtime of an entry (PAX records over its header's
/// fields). Ids must fit a `uid_t`.
fn meta(src: &Path, name: &str, entry: &TarEntry) -> Result<Meta> {
    let bad =
        |e: io::Error| Error::ImageSource(src.to_owned(), format!("entry {} has a bad header: {e}", quoted(name)));
    let id = |v: u64| {
        u32::try_from(v).map_err(|_| Error::UnsafeEntry { entry: name.to_owned(), reason: "owner id out of range" })
    };
    let (mtime_sec, mtime_nsec) = entry.mtime().map_err(bad)?;
    Ok(Meta {
        uid: id(entry.uid().map_err(bad)?)?,
        gid: id(entry.gid().map_err(bad)?)?,
        mode: entry.header.mode().map_err(bad)?,
        mtime_sec,
        mtime_nsec,
    })
}

fn path_reason(fault: PathFault) -> &'static str {
    match fault {
        PathFault::Absolute => "absolute path",
        PathFault::DotDot => "path has a '..' component",
        PathFault::Nul => "name contains a NUL byte",
    }
}

fn link_reason(fault: PathFault) -> &'static str {
    match fault {
        PathFault::Absolute => "hard link target is an absolute path",
        PathFault::DotDot => "hard link target has a '..' component",
        PathFault::Nul => "name contains a NUL byte",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tar::Header;

    #[test]
    fn sniffs_formats_by_content() {
        assert_eq!(sniff(&[0x1f, 0x8b, 8, 0]), Ok(Format::Gzip));
        assert_eq!(sniff(&[0x28, 0xb5, 0x2f, 0xfd, 0]), Ok(Format::Zstd));
        let mut header = Header::new_ustar();
        header.set_path("x").unwrap();
        header.set_cksum();
        assert_eq!(sniff(header.as_bytes()), Ok(Format::Tar));
        assert!(sniff(b"just some text").is_err());
        assert!(sniff(&[0u8; 512]).is_err(), "an all-zero block has no valid checksum");
        assert!(sniff(b"BZh91AY&SY").is_err());
    }
}

/// What [`unpack_layer_for_fuzzing`] gives back: the layer's diffid and
/// what its writer dropped or skipped.
#[doc(hidden)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuzzedLayer {
    pub diff_id: String,
    pub skipped: u64,
}

/// Unpacks layer `blob` into the (existing, empty) directory `into` as an
/// import does (`unpack_layer` and the layer's tree writer, its compression
/// told by its first bytes), writing at most `max_bytes`. Public (hidden)
/// only for the fuzz targets, which feed it hostile layers.
#[doc(hidden)]
pub fn unpack_layer_for_fuzzing(blob: &[u8], into: &Path, max_bytes: u64) -> Result<FuzzedLayer> {
    // Sparse files may be large (their holes cost nothing), their data not.
    let limits = crate::ImportLimits { max_expanded_size: max_bytes, max_logical_size: 1 << 30 };
    let source = Path::new("fuzzed-layer");
    let mut w = TreeWriter::for_layer(into, source, crate::limits::Budget::new(limits, None))?;
    let digests = unpack_layer(source, blob, None, &mut w)?;
    let skipped = w.skipped();
    w.finish()?;
    Ok(FuzzedLayer { diff_id: digests.diff_id, skipped })
}
