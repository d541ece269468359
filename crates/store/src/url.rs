//! Which backend holds the task database: `sqlite://PATH` or
//! `postgres://...`, as `cairn serve --store` and `[store] url` give it.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use crate::{Error, PostgresStore, Result, SharedStore, SqliteStore};

/// A store URL, checked.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// A SQLite file (`sqlite://PATH`; `sqlite:///var/lib/cairn/cairn.db`).
    Sqlite(PathBuf),
    /// A PostgreSQL database (`postgres://USER:PASSWORD@HOST:PORT/DB?...`,
    /// or `postgresql://`), kept as written, password included.
    Postgres(String),
}

impl StoreUrl {
    /// Opens the store this URL names, creating its tables if needed.
    pub async fn open(&self) -> Result<SharedStore> {
        Ok(match self {
            StoreUrl::Sqlite(path) => Arc::new(SqliteStore::open(path).await?),
            StoreUrl::Postgres(url) => Arc::new(PostgresStore::connect(url).await?),
        })
    }
}

impl FromStr for StoreUrl {
    type Err = Error;

    fn from_str(s: &str) -> Result<StoreUrl> {
        let bad = |why: &str| Error::Url(redact(s), why.to_owned());
        if let Some(path) = s.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err(bad("no file after sqlite:// (sqlite:///var/lib/cairn/cairn.db is an absolute path)"));
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            sqlx::postgres::PgConnectOptions::from_str(s).map_err(|e| bad(&e.to_string()))?;
            return Ok(StoreUrl::Postgres(s.to_owned()));
        }
        Err(bad("expected sqlite://PATH or postgres://USER@HOST/DATABASE"))
    }
}

/// Shown without the password.
impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            StoreUrl::Postgres(url) => f.write_str(&redact(url)),
        }
    }
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoreUrl({self})")
    }
}

/// `url` with the password (in the user part or a `password=` parameter)
/// replaced by `***`, for messages and logs.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(i) => before_query.split_at(i),
        None => (before_query, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{name}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let mut out = format!("{scheme}://{authority}{path}");
    if let Some(q) = query {
        let params: Vec<String> = q
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                _ => p.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_their_backend_and_never_show_a_password() {
        assert_eq!("sqlite:///var/lib/cairn/cairn.db".parse::<StoreUrl>().unwrap(), StoreUrl::Sqlite("/var/lib/cairn/cairn.db".into()));
        assert_eq!("sqlite://rel.db".parse::<StoreUrl>().unwrap(), StoreUrl::Sqlite("rel.db".into()));
        let pg: StoreUrl = "postgres://cairn:s3cret@db.example:5433/cairn?sslmode=require".parse().unwrap();
        assert_eq!(pg, StoreUrl::Postgres("postgres://cairn:s3cret@db.example:5433/cairn?sslmode=require".into()));
        assert_eq!(pg.to_string(), "postgres://cairn:***@db.example:5433/cairn?sslmode=require");
        assert!(!format!("{pg:?}").contains("s3cret"));
        assert!("postgresql://u@h/d".parse::<StoreUrl>().is_ok());
        assert_eq!(redact("postgres://u@h/d?password=p&x=1"), "postgres://u@h/d?password=***&x=1");
        assert_eq!(redact("postgres://h"), "postgres://h");
        for bad in ["sqlite://", "mysql://u@h/d", "/var/lib/cairn/cairn.db", "postgres://u:p@h:notaport/d"] {
            let err = bad.parse::<StoreUrl>().unwrap_err();
            assert!(matches!(err, Error::Url(..)), "{bad}: {err}");
            assert!(!err.to_string().contains(":p@"), "{err}");
        }
    }
}
