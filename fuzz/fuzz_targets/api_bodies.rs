#![no_main]

use cairn_api::api_keys::CreateApiKey;
use cairn_api::deliver::DeliverRequest;
use cairn_api::egress::PolicyUpdate;
use cairn_api::exec::{ClientFrame, ExecStart, RunRequest};
use cairn_api::images::{CommitRequest, ImportRequest, PullRequest};
use cairn_api::processes::{Resize, StartProcess};
use cairn_api::snapshots::{CheckRequest, ForkRequest, GcRequest, RollbackRequest, SnapshotRequest};
use cairn_api::tasks::CreateRequest;
use cairn_api::waits::{ApproveRequest, EventRequest, WaitRequest};
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The request bodies the server reads, in the order the first byte of
/// an input picks them (keep in step with the seeds in the corpus).
const BODIES: &[fn(&[u8])] = &[
    body::<CreateRequest>,
    body::<RunRequest>,
    body::<ExecStart>,
    body::<ClientFrame>,
    body::<SnapshotRequest>,
    body::<RollbackRequest>,
    body::<ForkRequest>,
    body::<WaitRequest>,
    body::<ApproveRequest>,
    body::<EventRequest>,
    body::<DeliverRequest>,
    body::<ImportRequest>,
    body::<PullRequest>,
    body::<CommitRequest>,
    body::<GcRequest>,
    body::<CheckRequest>,
    body::<StartProcess>,
    body::<Resize>,
    body::<PolicyUpdate>,
    body::<CreateApiKey>,
];

fuzz_target!(|data: &[u8]| {
    let Some((&kind, doc)) = data.split_first() else { return };
    BODIES[usize::from(kind) % BODIES.len()](doc);
});

/// Parses `doc` as the server does (a blank body is `{}`); what parses,
/// serialised again, parses back to the same request.
fn body<T: DeserializeOwned + Serialize + PartialEq>(doc: &[u8]) {
    let doc = if doc.iter().all(u8::is_ascii_whitespace) { b"{}".as_slice() } else { doc };
    let Ok(req) = serde_json::from_slice::<T>(doc) else { return };
    let json = serde_json::to_vec(&req).expect("a request serialises");
    let back: T = match serde_json::from_slice(&json) {
        Ok(back) => back,
        Err(e) => panic!("{} does not parse back from {}: {e}", std::any::type_name::<T>(), String::from_utf8_lossy(&json)),
    };
    // PullRequest has no Debug (it holds a password).
    assert!(back == req, "{} changed on a round trip through {}", std::any::type_name::<T>(), String::from_utf8_lossy(&json));
}
