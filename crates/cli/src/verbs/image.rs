//! `cairn image list | import | rm`.

use anyhow::{anyhow, Context, Result};
use cairn_api as api;
use clap::Subcommand;
use serde_json::Value;

use crate::client::Client;
use crate::output;
use crate::progress;
use super::Out;

#[derive(Subcommand, Debug)]
pub(crate) enum ImageCmd {
    List,
    /// Import a rootfs directory or a tar, tar.gz or tar.zst archive.
    Import { name: String, path: std::path::PathBuf },
    Rm { name: String },
}

pub(crate) async fn run(client: &Client, cmd: ImageCmd, out: Out) -> Result<u8> {
    match cmd {
        ImageCmd::List => list(client, out).await,
        ImageCmd::Import { name, path } => import(client, name, path, out).await,
        ImageCmd::Rm { name } => rm(client, name, out).await,
    }
}

pub(crate) async fn list(client: &Client, out: Out) -> Result<u8> {
    let print = |v: &Value, human: &dyn Fn(&Value) -> String| out.print(v, human);
    let v: Value = client.get("/v1/images").await?;
    print(&v, &output::image_table);
    Ok(0)
}

pub(crate) async fn import(client: &Client, name: String, path: std::path::PathBuf, out: Out) -> Result<u8> {
    let print = |v: &Value, human: &dyn Fn(&Value) -> String| out.print(v, human);
    let abs = std::fs::canonicalize(&path).with_context(|| format!("cannot import {}", path.display()))?;
    let path = abs.to_str().ok_or_else(|| anyhow!("cannot import {}: the path is not UTF-8", abs.display()))?.to_owned();
    let v = client.post("/v1/images", &api::images::ImportRequest { name, path }).await?;
    print(&v, &|v| {
        let d = &v["dropped"];
        format!(
            "imported {} ({} entries, {}; dropped {} device nodes, {} fifos/sockets, {} setuid/setgid bits)",
            v["name"].as_str().unwrap_or_default(),
            v["files"],
            progress::human(v["size_bytes"].as_f64().unwrap_or(0.0)),
            d["devices"],
            d["fifos_sockets"],
            d["setid"]
        )
    });
    Ok(0)
}

pub(crate) async fn rm(client: &Client, name: String, out: Out) -> Result<u8> {
    let print = |v: &Value, human: &dyn Fn(&Value) -> String| out.print(v, human);
    let v = client.delete(&format!("/v1/images/{name}")).await?;
    print(&v, &|_| format!("removed image {name}"));
    Ok(0)
}
