//! Cairn's egress allowlist and the per-task proxy that enforces it.
//!
//! The decision modules are pure: nothing in them resolves names or opens
//! sockets. The [`proxy`] module does the I/O and asks them for every
//! decision.
//!
//! - [`host`]: a destination name normalised once ([`Host`]), so rules and
//!   requests compare as plain strings; IP literals in every spelling a URL
//!   parser accepts are recognised ([`parse_ip_literal`]) and refused as names.
//! - [`policy`]: `HOST[:PORT]` allow and deny rules ([`Policy`]) and the
//!   [`Decision`] for a host and port, with the rule and reason for the log.
//! - [`addr`]: reserved address ranges ([`classify`]), so a public name that
//!   resolves to a private address is still refused, and the operator's
//!   explicit exceptions ([`AllowedRanges`]).
//! - [`connect`]: the head of a proxy request, `CONNECT host:port` or an
//!   absolute-form `GET http://host/...` ([`parse_request_head`]), and the
//!   check that its `Host` header names the same place.
//! - [`sni`]: the server name in a TLS ClientHello ([`parse_client_hello`]),
//!   read from the bytes a client sends into a CONNECT tunnel.
//! - [`rules`]: per-host request rules (methods, path prefixes) and the
//!   headers and placeholders the proxy fills in from secrets.
//! - [`scrub`]: byte strings replaced in a stream, across chunk borders.
//! - [`ca`]: a task's own certificate authority, whose leaves the proxy
//!   shows for the hosts it intercepts.
//! - [`proxy`]: the proxy of one task ([`TaskProxy`]): CONNECT tunnels and
//!   plain HTTP forwarding, each attempt logged as an [`Attempt`].

pub mod addr;
pub mod ca;
pub mod connect;
mod error;
pub mod host;
pub mod policy;
pub mod proxy;
pub mod rules;
pub mod scrub;
pub mod sni;

pub use addr::{classify, AllowedRanges, Cidr};
pub use connect::{host_header_agrees, parse_request_head, RequestHead, Target};
pub use error::{Error, Result};
pub use host::{normalise, parse_ip_literal, Host};
pub use policy::{Decision, Policy, Rule};
pub use rules::{HostRules, Inject, Injection, Part, RequestRule};
pub use proxy::{Attempt, AttemptKind, ProxyConfig, Resolver, SystemResolver, TaskProxy};
pub use sni::{parse_client_hello, ClientHello};
