//! `cairn process list|show|stdin|kill`: background commands started with
//! `cairn exec --detach` (or the API's `/v1/tasks/{id}/processes`).

use anyhow::Result;
use cairn_api::processes::{ProcessOutput, ProcessView};
use clap::Subcommand;
use tokio::io::AsyncReadExt;

use super::Out;
use crate::client::{Answer, Client};

#[derive(Subcommand, Debug)]
pub(crate) enum ProcessCmd {
    /// A task's background commands, running or ended in the last ten minutes.
    List { task: String },
    /// One command: how it stands and its output so far (`--wait`: after its
    /// end, waiting at most that long, e.g. 5m).
    Show {
        task: String,
        id: String,
        /// Wait for its end, at most this long (e.g. 5m), then show it.
        #[arg(long, value_name = "DURATION")]
        wait: Option<String>,
    },
    /// Send this process's stdin to the command's (then close it).
    Stdin { task: String, id: String },
    /// Kill the command and everything it started, or send it another signal.
    Kill {
        task: String,
        id: String,
        /// A signal other than KILL: TERM, INT, HUP, QUIT, USR1, USR2 (or its number).
        #[arg(long)]
        signal: Option<String>,
    },
}

fn line(p: &ProcessView) -> String {
    let how = match (&p.exit, &p.error) {
        (_, Some(e)) => format!("failed: {e}"),
        (Some(e), _) => match e.signal {
            Some(s) => format!("killed by signal {s}"),
            None => format!("exited {}", e.exit_code),
        },
        _ => "running".to_owned(),
    };
    format!("{:<6} {:<10} {:<24} {}", p.id, p.tag.as_deref().unwrap_or("-"), how, p.argv.join(" "))
}

pub(crate) async fn run(client: &Client, cmd: ProcessCmd, out: Out) -> Result<u8> {
    match cmd {
        ProcessCmd::List { task } => {
            let v: Answer<Vec<ProcessView>> = client.get(&format!("/v1/tasks/{task}/processes")).await?;
            out.print(&v, |ps| std::iter::once(format!("{:<6} {:<10} {:<24} {}", "ID", "TAG", "STATE", "COMMAND")).chain(ps.iter().map(line)).collect::<Vec<_>>().join("\n"));
        }
        ProcessCmd::Show { task, id, wait } => {
            let query = match wait {
                Some(w) => format!("?wait_ms={}", cairn_core::parse_duration(&w)?.as_millis()),
                None => String::new(),
            };
            let v: Answer<ProcessOutput> = client.get(&format!("/v1/tasks/{task}/processes/{id}{query}")).await?;
            out.print(&v, |p| format!("{}\n{}{}", line(&p.process), p.stdout, p.stderr));
        }
        ProcessCmd::Stdin { task, id } => {
            let mut data = Vec::new();
            tokio::io::stdin().read_to_end(&mut data).await?;
            let path = format!("/v1/tasks/{task}/processes/{id}/stdin?close=true");
            let v: Answer<ProcessView> = client.send(client.request(reqwest::Method::POST, &path).body(data)).await?;
            out.print(&v, line);
        }
        ProcessCmd::Kill { task, id, signal } => {
            let query = match signal {
                Some(s) => {
                    let n = cairn_api::exec::signal_number(&s).ok_or_else(|| anyhow::anyhow!("signal {s:?} is not one of HUP, INT, QUIT, KILL, USR1, USR2, TERM"))?;
                    format!("?signal={n}")
                }
                None => String::new(),
            };
            let v: Answer<ProcessView> = client.post_empty(&format!("/v1/tasks/{task}/processes/{id}/kill{query}")).await?;
            out.print(&v, line);
        }
    }
    Ok(0)
}
