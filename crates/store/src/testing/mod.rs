//! What tests need besides the code under test: this crate's own, and,
//! with the `test-util` feature, other crates' (a PostgreSQL store shared
//! by several daemons).

pub mod postgres;
