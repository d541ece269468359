//! Where a node keeps its blob store: `cairn serve --blob URL`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::backend::parse_s3_url;
use crate::cache::CachedBackend;
use crate::{ObjectStoreBackend, Result, WriteBackend};

/// A blob store location: a local directory (a path or `file:///PATH`) or
/// S3-compatible storage (`s3://BUCKET/PREFIX`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlobUrl {
    Local(PathBuf),
    S3(String),
}

impl BlobUrl {
    /// Parses and checks a location; the error says what is accepted.
    pub fn parse(s: &str) -> std::result::Result<BlobUrl, String> {
        let s = s.trim();
        if s.starts_with("s3://") {
            parse_s3_url(s).map_err(|why| format!("blob store {s}: {why}"))?;
            return Ok(BlobUrl::S3(s.trim_end_matches('/').to_string()));
        }
        let path = match s.strip_prefix("file://") {
            Some(p) if p.starts_with('/') => PathBuf::from(p),
            Some(_) => return Err(format!("blob store {s}: a file URL needs an absolute path, file:///PATH")),
            None if s.contains("://") => {
                return Err(format!("blob store {s}: unsupported; use a local path, file:///PATH or s3://BUCKET/PREFIX"));
            }
            None if s.is_empty() => return Err("blob store: empty location".to_string()),
            None => PathBuf::from(s),
        };
        let path = std::path::absolute(&path).map_err(|e| format!("blob store {s}: {e}"))?;
        Ok(BlobUrl::Local(path))
    }

    /// True for a store on another machine (one that gets a local cache).
    pub fn is_remote(&self) -> bool {
        matches!(self, BlobUrl::S3(_))
    }

    /// Opens the store. A remote one is configured from the standard
    /// environment (see [`ObjectStoreBackend::s3`]) and gets a cache of its
    /// packs in `cache_dir`, bounded to `cache_bytes` (0: no cache).
    pub fn open(&self, cache_dir: &Path, cache_bytes: u64) -> Result<Arc<dyn WriteBackend>> {
        match self {
            BlobUrl::Local(path) => Ok(Arc::new(ObjectStoreBackend::local(path)?)),
            BlobUrl::S3(url) => {
                let store: Arc<dyn WriteBackend> = Arc::new(ObjectStoreBackend::s3(url, &[])?);
                if cache_bytes == 0 {
                    return Ok(store);
                }
                Ok(Arc::new(CachedBackend::open(store, cache_dir, cache_bytes)?))
            }
        }
    }
}

impl std::fmt::Display for BlobUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlobUrl::Local(p) => write!(f, "{}", p.display()),
            BlobUrl::S3(url) => f.write_str(url),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_paths_file_and_s3_urls() {
        assert_eq!(BlobUrl::parse("/var/lib/cairn/blobs").unwrap(), BlobUrl::Local("/var/lib/cairn/blobs".into()));
        assert_eq!(BlobUrl::parse("file:///srv/blobs").unwrap(), BlobUrl::Local("/srv/blobs".into()));
        assert!(matches!(BlobUrl::parse("relative/dir").unwrap(), BlobUrl::Local(p) if p.is_absolute() && p.ends_with("relative/dir")));
        assert_eq!(BlobUrl::parse("s3://my-bucket/cairn/prod/").unwrap(), BlobUrl::S3("s3://my-bucket/cairn/prod".into()));
        assert_eq!(BlobUrl::parse("s3://my-bucket").unwrap(), BlobUrl::S3("s3://my-bucket".into()));
        assert!(BlobUrl::parse("s3://my-bucket").unwrap().is_remote());
        for (bad, says) in [
            ("s3://", "bucket name"),
            ("s3://No_Such/x", "bucket name"),
            ("s3://bucket/../x", "key prefix"),
            ("gs://bucket/x", "unsupported"),
            ("file://relative", "absolute"),
            ("", "empty"),
        ] {
            let err = BlobUrl::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
