//! `cairn log ID --verify` and `--checkpoint`, `cairn key show` and
//! `rotate`: the client side of the ledger.

use anyhow::{anyhow, Result};
use cairn_api::ledger::{CheckpointView, KeyInfo, LedgerView};
use cairn_core::Event;

use crate::client::{Answer, Client};
use crate::output::time;

/// Prints an answer as the daemon sent it (`--json`).
fn print_raw<T>(a: &Answer<T>) {
    outln!("{}", serde_json::to_string_pretty(&a.raw).unwrap_or_default());
}

/// Walks the task's chain on the daemon. Exits non-zero with one line
/// naming the first bad entry.
pub async fn verify(client: &Client, task: &str, json_out: bool) -> Result<u8> {
    let a: Answer<LedgerView> = client.get(&format!("/v1/tasks/{task}/ledger")).await?;
    let v = &a.body;
    let id = &v.task;
    if json_out {
        print_raw(&a);
    }
    if !v.ok {
        let problem = v.problem.as_deref().unwrap_or("the ledger does not verify");
        if json_out {
            eprintln!("cairn: ledger of {id}: {problem}");
            return Ok(1);
        }
        return Err(anyhow!("ledger of {id}: {problem}"));
    }
    if !json_out {
        let head = match (v.head_seq, &v.head) {
            (Some(seq), Some(h)) => format!("head {seq} {h}"),
            _ => "empty".to_owned(),
        };
        let checkpoint = match &v.checkpoint {
            Some(c) => {
                let n = v.checkpoints;
                let all = if n > 1 { format!(" ({n} checkpoints, all verified)") } else { String::new() };
                format!("checkpoint at seq {} verified, signed by key {} at {}{all}", c.seq, c.key_id, time(c.time_ms))
            }
            None => format!("no checkpoint yet (`cairn log {id} --checkpoint` signs one)"),
        };
        outln!("ledger of {id}: {} entries, {head}, {checkpoint}", v.entries);
    }
    Ok(0)
}

/// Signs the task's chain head now.
pub async fn checkpoint(client: &Client, task: &str, json_out: bool) -> Result<u8> {
    let a: Answer<CheckpointView> = client.post_empty(&format!("/v1/tasks/{task}/checkpoint")).await?;
    if json_out {
        print_raw(&a);
    } else {
        let v = &a.body;
        outln!("checkpoint of {} at seq {}: head {}, signed by key {} at {}", v.task, v.seq, v.head, v.key_id, time(v.time_ms));
    }
    Ok(0)
}

/// The current key; with `--json`, every key the node has used.
pub async fn key_show(client: &Client, json_out: bool) -> Result<u8> {
    let a: Answer<Vec<KeyInfo>> = client.get("/v1/keys").await?;
    if json_out {
        print_raw(&a);
        return Ok(0);
    }
    let keys = &a.body;
    let current = keys.iter().find(|k| k.current).ok_or_else(|| anyhow!("the daemon reported no current key"))?;
    outln!("key id:     {}", current.key_id);
    outln!("public key: {}", current.public_key);
    outln!("created:    {}", time(current.created_ms));
    if keys.len() > 1 {
        outln!("({} older key(s) kept to verify what they signed: cairn --json key show)", keys.len() - 1);
    }
    Ok(0)
}

/// A new signing key; the old public keys stay.
pub async fn key_rotate(client: &Client, json_out: bool) -> Result<u8> {
    let a: Answer<KeyInfo> = client.post_empty("/v1/keys/rotate").await?;
    if json_out {
        print_raw(&a);
    } else {
        outln!("new signing key {}, public key {}", a.body.key_id, a.body.public_key);
        outln!("older keys stay known: what they signed still verifies");
    }
    Ok(0)
}

#[derive(clap::Subcommand, Debug)]
pub(crate) enum KeyCmd {
    /// The current key's id and public key (with --json: every key used).
    Show,
    /// Sign with a new key from now on; the old public key stays known.
    Rotate,
}

/// `cairn key show | rotate`.
pub(crate) async fn key(client: &Client, cmd: KeyCmd, json_out: bool) -> Result<u8> {
    match cmd {
        KeyCmd::Show => key_show(client, json_out).await,
        KeyCmd::Rotate => key_rotate(client, json_out).await,
    }
}

/// `cairn log ID [--verify | --checkpoint]`.
pub(crate) async fn log(client: &Client, task: &str, verify_chain: bool, checkpoint_now: bool, out: crate::verbs::Out) -> Result<u8> {
    if verify_chain {
        return verify(client, task, out.json).await;
    }
    if checkpoint_now {
        return checkpoint(client, task, out.json).await;
    }
    let v: Answer<Vec<Event>> = client.get(&format!("/v1/tasks/{task}/events")).await?;
    out.print(&v, |v| crate::output::event_table(v));
    Ok(0)
}
