use thiserror::Error;

/// Invalid egress input. Each variant names the value that was wrong and why.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    #[error("invalid host {host:?}: {problem}")]
    Host { host: String, problem: String },
    #[error("host {host:?} is an IP address ({ip}), not a name")]
    IpLiteral { host: String, ip: std::net::IpAddr },
    #[error("invalid rule {rule:?}: {problem}")]
    Rule { rule: String, problem: String },
    #[error("invalid port {port:?} in rule {rule:?}: expected a number from 1 to 65535")]
    Port { rule: String, port: String },
    #[error("invalid address range {range:?}: {problem}")]
    Range { range: String, problem: String },
    /// A proxy request head the proxy will not act on.
    #[error("bad proxy request: {problem}")]
    Request { problem: String },
    /// The absolute-form URI and the `Host` header name different places.
    #[error("Host header {header:?} does not match request target {target:?}")]
    HostMismatch { target: String, header: String },
    /// The first bytes after CONNECT are not a TLS handshake starting with a
    /// ClientHello.
    #[error("not a TLS ClientHello: {problem}")]
    NotTls { problem: String },
    /// A ClientHello whose lengths or fields do not add up.
    #[error("malformed TLS ClientHello: {problem}")]
    MalformedHello { problem: String },
    /// A head or handshake bigger than the parser will buffer.
    #[error("{what} exceeds {limit} bytes")]
    TooLarge { what: &'static str, limit: usize },
    /// A certificate or TLS configuration the proxy could not make or load.
    #[error("TLS: {0}")]
    Tls(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
