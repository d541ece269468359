//! `cairn node list`.

use anyhow::Result;
use cairn_api::nodes::Node;
use clap::Subcommand;

use super::Out;
use crate::client::{Answer, Client};
use crate::output;

#[derive(Subcommand, Debug)]
pub(crate) enum NodeCmd {
    /// The daemons sharing the task database: up or down (by their
    /// heartbeats), load and the tasks whose sandbox each runs.
    List,
}

pub(crate) async fn run(client: &Client, cmd: NodeCmd, out: Out) -> Result<u8> {
    match cmd {
        NodeCmd::List => list(client, out).await,
    }
}

async fn list(client: &Client, out: Out) -> Result<u8> {
    let v: Answer<Vec<Node>> = client.get("/v1/nodes").await?;
    out.print(&v, |v| output::node_table(v));
    Ok(0)
}
