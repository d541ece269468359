//! What the tests of this crate need besides the code under test.

pub(crate) mod postgres;
