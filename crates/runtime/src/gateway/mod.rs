//! The event gateway's primitives, kept free of routing and storage.
//!
//! - [`webhook`]: signature checks on incoming webhooks, per the Standard
//!   Webhooks spec (<https://www.standardwebhooks.com>), on plain bytes, and
//!   signing for tests and for clients.
//! - [`approval`]: signed, unguessable, expiring approval links, keyed by a
//!   private file in the data directory.

pub mod approval;
pub mod webhook;
