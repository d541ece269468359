//! One module per group of verbs: each owns its arguments (clap) and
//! turns them into typed requests of the wire model (`cairn_api`), then
//! prints the answer as a line or, with `--json`, as it came.

pub mod egress;
pub mod image;
pub mod snapshot;
pub mod task;
pub mod waits;

use serde_json::Value;

/// How answers are printed: one human line, or the JSON with `--json`.
#[derive(Clone, Copy, Debug)]
pub struct Out {
    pub json: bool,
}

impl Out {
    pub fn print(self, v: &Value, human: &dyn Fn(&Value) -> String) {
        if self.json {
            println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
        } else {
            let h = human(v);
            if !h.is_empty() {
                println!("{h}");
            }
        }
    }
}
