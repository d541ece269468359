//! Cairn's egress allowlist: what a task's outbound connection may reach.
//! Pure: nothing here resolves names or opens sockets; the proxy does that
//! and asks this crate for every decision.
//!
//! - [`host`]: a destination name normalised once ([`Host`]), so rules and
//!   requests compare as plain strings; IP literals in every spelling a URL
//!   parser accepts are recognised ([`parse_ip_literal`]) and refused as names.
//! - [`policy`]: `HOST[:PORT]` allow and deny rules ([`Policy`]) and the
//!   [`Decision`] for a host and port, with the rule and reason for the log.
//! - [`addr`]: reserved address ranges ([`classify`]), so a public name that
//!   resolves to a private address is still refused, and the operator's
//!   explicit exceptions ([`AllowedRanges`]).

pub mod addr;
mod error;
pub mod host;
pub mod policy;

pub use addr::{classify, AllowedRanges, Cidr};
pub use error::{Error, Result};
pub use host::{normalise, parse_ip_literal, Host};
pub use policy::{Decision, Policy, Rule};
