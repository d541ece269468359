//! What the event gateway shows people: [`page`], the server-rendered
//! approval page (no JavaScript, no external assets) and its confirmation
//! and error variants. The checks behind it are the runtime's
//! (`cairn_runtime::gateway`).

pub mod page;
