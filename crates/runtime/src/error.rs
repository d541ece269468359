//! The runtime's one error type. Each variant is a kind of failure a caller
//! can act on; the HTTP front end maps kinds to statuses and the stable
//! codes of `cairn_api::ErrorCode`, and nothing here knows about HTTP.

use cairn_api::ErrorCode;

type Source = Box<dyn std::error::Error + Send + Sync>;

/// Why a runtime operation failed. The message is one line naming what was
/// wrong, meant for people.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request names something invalid or is malformed.
    #[error("{0}")]
    Invalid(String),
    /// No such task, snapshot, wait, image or object.
    #[error("{0}")]
    NotFound(String),
    /// Not possible in the task's current state, or a name in use.
    #[error("{0}")]
    Conflict(String),
    /// A webhook or a link that does not verify.
    #[error("{0}")]
    Unauthorized(String),
    /// Refused for what it is (an approval link that is not valid).
    #[error("{0}")]
    Forbidden(String),
    /// A body over its limit.
    #[error("{0}")]
    TooLarge(String),
    /// More at once than a bound of the daemon allows (commands running in a
    /// task, open event streams); the message names the bound.
    #[error("{0}")]
    TooMany(String),
    /// A disk or the blob store is full.
    #[error("{0}")]
    NoSpace(String),
    /// The runtime cannot do it right now (shutting down, overloaded).
    #[error("{0}")]
    Unavailable(String),
    /// A failure of the runtime itself, with what caused it when known.
    #[error("{message}")]
    Internal {
        message: String,
        #[source]
        source: Option<Source>,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn invalid(m: impl Into<String>) -> Self {
        Error::Invalid(m.into())
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Error::NotFound(m.into())
    }
    pub fn conflict(m: impl Into<String>) -> Self {
        Error::Conflict(m.into())
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Error::Internal { message: m.into(), source: None }
    }
    /// An internal failure that keeps its cause (for logs and `source()`).
    pub fn internal_from(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Error::Internal { message: e.to_string(), source: Some(Box::new(e)) }
    }
    /// An internal failure said in `message` (which names the cause where
    /// it reads best), keeping the cause as its `source()`.
    pub fn internal_with(message: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Error::Internal { message: message.into(), source: Some(Box::new(source)) }
    }
    /// The same kind with `what: ` in front of the message.
    pub fn context(self, what: &str) -> Self {
        match self {
            Error::Invalid(m) => Error::Invalid(format!("{what}: {m}")),
            Error::NotFound(m) => Error::NotFound(format!("{what}: {m}")),
            Error::Conflict(m) => Error::Conflict(format!("{what}: {m}")),
            Error::Unauthorized(m) => Error::Unauthorized(format!("{what}: {m}")),
            Error::Forbidden(m) => Error::Forbidden(format!("{what}: {m}")),
            Error::TooLarge(m) => Error::TooLarge(format!("{what}: {m}")),
            Error::TooMany(m) => Error::TooMany(format!("{what}: {m}")),
            Error::NoSpace(m) => Error::NoSpace(format!("{what}: {m}")),
            Error::Unavailable(m) => Error::Unavailable(format!("{what}: {m}")),
            Error::Internal { message, source } => Error::Internal { message: format!("{what}: {message}"), source },
        }
    }

    /// The stable machine-readable code of this kind.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Invalid(_) => ErrorCode::Invalid,
            Error::NotFound(_) => ErrorCode::NotFound,
            Error::Conflict(_) => ErrorCode::Conflict,
            Error::Unauthorized(_) => ErrorCode::Unauthorized,
            Error::Forbidden(_) => ErrorCode::Forbidden,
            Error::TooLarge(_) => ErrorCode::TooLarge,
            Error::TooMany(_) => ErrorCode::TooManyRequests,
            Error::NoSpace(_) => ErrorCode::NoSpace,
            Error::Unavailable(_) => ErrorCode::Unavailable,
            Error::Internal { .. } => ErrorCode::Internal,
        }
    }
}

impl From<cairn_store::Error> for Error {
    fn from(e: cairn_store::Error) -> Self {
        use cairn_store::Error as E;
        match e {
            E::UnknownTask(_) | E::UnknownSnapshot(_) | E::UnknownWait(_) => Error::NotFound(e.to_string()),
            E::Unsupported(_) => Error::Conflict(e.to_string()),
            E::NameTaken(_) | E::KeyNameTaken(_) | E::WaitPending(_) | E::StateChanged { .. } | E::Transition { .. } | E::Leased { .. } | E::LeaseLost { .. } => {
                Error::Conflict(e.to_string())
            }
            _ => Error::internal_from(e),
        }
    }
}

impl From<cairn_core::Error> for Error {
    fn from(e: cairn_core::Error) -> Self {
        match e {
            cairn_core::Error::Transition { .. } => Error::Conflict(e.to_string()),
            _ => Error::Invalid(e.to_string()),
        }
    }
}

impl From<cairn_sandbox::Error> for Error {
    fn from(e: cairn_sandbox::Error) -> Self {
        use cairn_sandbox::Error as E;
        match e {
            E::Image(e) => Error::from(e),
            E::DiskSpace(_) => Error::NoSpace(e.to_string()),
            E::NotRunning(_) => Error::Conflict(e.to_string()),
            E::PathEscape(_) => Error::Invalid(e.to_string()),
            _ => Error::internal_from(e),
        }
    }
}

impl From<cairn_image::Error> for Error {
    fn from(e: cairn_image::Error) -> Self {
        use cairn_image::Error as E;
        match e {
            E::UnknownImage(_) => Error::NotFound(e.to_string()),
            E::ImageExists(_) | E::ImageInUse(..) | E::ImageBuiltIn(_) => Error::Conflict(e.to_string()),
            E::UnsafeEntry { .. } | E::UnsafeLayerEntry { .. } | E::ImageSource(..) | E::InvalidImageName(_) => Error::Invalid(e.to_string()),
            E::ImageTooLarge { bound: cairn_image::SizeBound::FreeSpace, .. } => Error::NoSpace(e.to_string()),
            E::ImageTooLarge { .. } => Error::TooLarge(e.to_string()),
            _ => Error::internal_from(e),
        }
    }
}

impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Self {
        Error::Internal { message: format!("worker failed: {e}"), source: Some(Box::new(e)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_keep_their_code_under_context() {
        let cases = [
            (Error::invalid("x"), ErrorCode::Invalid),
            (Error::not_found("x"), ErrorCode::NotFound),
            (Error::conflict("x"), ErrorCode::Conflict),
            (Error::Unauthorized("x".into()), ErrorCode::Unauthorized),
            (Error::Forbidden("x".into()), ErrorCode::Forbidden),
            (Error::TooLarge("x".into()), ErrorCode::TooLarge),
            (Error::TooMany("x".into()), ErrorCode::TooManyRequests),
            (Error::NoSpace("x".into()), ErrorCode::NoSpace),
            (Error::Unavailable("x".into()), ErrorCode::Unavailable),
            (Error::internal("x"), ErrorCode::Internal),
        ];
        for (e, code) in cases {
            let e = e.context("step");
            assert_eq!(e.code(), code);
            assert_eq!(e.to_string(), "step: x");
        }
    }

    #[test]
    fn internal_errors_keep_their_source() {
        let e = Error::from(cairn_store::Error::Corrupt("task row", "bad".into()));
        assert_eq!(e.code(), ErrorCode::Internal);
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(Error::from(cairn_store::Error::UnknownTask("t1".into())).code(), ErrorCode::NotFound);
    }

    #[test]
    fn internal_errors_said_in_context_keep_their_source() {
        let io = || std::io::Error::other("disk on fire");
        let e = Error::internal_from(io()).context("pipes");
        assert_eq!(e.to_string(), "pipes: disk on fire");
        assert_eq!(std::error::Error::source(&e).map(ToString::to_string).as_deref(), Some("disk on fire"));
        let e = Error::internal_with("manifest unreadable (disk on fire); run `cairn check`", io());
        assert_eq!(e.code(), ErrorCode::Internal);
        assert!(std::error::Error::source(&e).is_some());
        assert!(std::error::Error::source(&Error::internal("x")).is_none());
    }

    #[test]
    fn a_bad_image_name_is_the_callers_mistake() {
        // Found by the API fuzz: it answered 500 for `"image": ""`.
        let bad = cairn_core::Error::ImageName(String::new());
        assert_eq!(Error::from(cairn_image::Error::InvalidImageName(bad)).code(), ErrorCode::Invalid);
        let bad = cairn_core::Error::ImageName(String::new());
        assert_eq!(Error::from(cairn_sandbox::Error::Image(cairn_image::Error::InvalidImageName(bad))).code(), ErrorCode::Invalid, "through the driver too");
    }
}
