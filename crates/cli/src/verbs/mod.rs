//! One module per group of verbs: each owns its arguments (clap) and
//! turns them into typed requests of the wire model (`cairn_api`), then
//! prints the typed answer as a line or, with `--json`, as it came.

pub mod api_key;
pub mod backup;
pub mod secret;
pub mod egress;
pub mod hooks;
pub mod image;
pub mod node;
pub mod process;
pub mod snapshot;
pub mod task;
pub mod waits;

use anyhow::Result;

use crate::client::Answer;

/// How answers are printed: one human line, or the JSON with `--json`.
#[derive(Clone, Copy, Debug)]
pub struct Out {
    pub json: bool,
}

impl Out {
    /// With `--json`, the answer as the daemon sent it; else what `human`
    /// makes of its typed body, unless that is empty.
    pub fn print<T>(self, answer: &Answer<T>, human: impl FnOnce(&T) -> String) {
        if self.json {
            outln!("{}", serde_json::to_string_pretty(&answer.raw).unwrap_or_default());
        } else {
            let h = human(&answer.body);
            if !h.is_empty() {
                outln!("{h}");
            }
        }
    }

    /// [`Out::print`] for human output that can find the answer malformed.
    pub fn try_print<T>(self, answer: &Answer<T>, human: impl FnOnce(&T) -> Result<String>) -> Result<()> {
        if self.json {
            self.print(answer, |_| String::new());
        } else {
            let h = human(&answer.body)?;
            self.print(answer, |_| h);
        }
        Ok(())
    }
}
