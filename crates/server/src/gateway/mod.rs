//! The event gateway's primitives, kept free of routing and storage so the
//! HTTP layer and the store can be wired to them separately.
//!
//! - [`webhook`]: signature checks on incoming webhooks, per the Standard
//!   Webhooks spec (<https://www.standardwebhooks.com>), and signing for tests
//!   and for clients.
//! - [`approval`]: signed, unguessable, expiring approval links, keyed by a
//!   private file in the data directory.
//! - [`page`]: the server-rendered approval page (no JavaScript, no external
//!   assets) and its confirmation and error variants.

pub mod approval;
pub mod page;
pub mod webhook;
