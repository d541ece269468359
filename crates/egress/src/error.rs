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
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
