//! `cairn egress log` and `cairn egress set`.

use anyhow::Result;
use cairn_api::egress::EgressView;
use clap::Subcommand;

use crate::client::{Answer, Client};
use crate::output;
use super::Out;

#[derive(Subcommand, Debug)]
pub(crate) enum EgressCmd {
    /// Every connection attempt through the task's proxy, allowed or not.
    Log { task: String },
    /// Changes a task's egress rules (as `cairn task update`): --allow,
    /// --deny, --rule, --inject, --clear-egress.
    Set(super::task::UpdateArgs),
}

pub(crate) async fn run(client: &Client, cmd: EgressCmd, out: Out) -> Result<u8> {
    match cmd {
        EgressCmd::Log { task } => log(client, task, out).await,
        EgressCmd::Set(a) => super::task::update(client, a, out).await,
    }
}

pub(crate) async fn log(client: &Client, task: String, out: Out) -> Result<u8> {
    let v: Answer<EgressView> = client.get(&format!("/v1/tasks/{task}/egress")).await?;
    out.try_print(&v, output::egress_log)?;
    Ok(0)
}
