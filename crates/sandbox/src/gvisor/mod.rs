//! The gvisor driver, in progress (issue 17): tasks whose sandbox runs
//! under gVisor's `runsc` over the same root overlay and writable layer as
//! the native driver. So far: the OCI runtime spec a sandbox is started
//! from (`spec.rs`). What runsc does on these machines, and so what the
//! driver must take care of: docs/gvisor-notes.md.

pub mod spec;
