//! `cairn image list | inspect | import | pull | commit | rm`.

use anyhow::{anyhow, Context, Result};
use cairn_api as api;
use api::images::{Image, ImageDetail, Removed};
use clap::Subcommand;

use crate::client::{Answer, Client};
use crate::output;
use crate::progress;
use super::Out;

#[derive(Subcommand, Debug)]
pub(crate) enum ImageCmd {
    /// Every image: its kind (host, rootfs, oci, template) and layer count.
    List,
    /// One image: kind, layers (diffids and sizes), manifest digest and the
    /// run config tasks take from it (Env, WorkingDir, User, Entrypoint, Cmd).
    Inspect { name: String },
    /// Import a rootfs directory, a tar, tar.gz or tar.zst archive, an OCI
    /// image layout directory, or a `docker save` archive (plain or
    /// compressed); the layers of the last two are stored once and shared.
    Import {
        name: String,
        path: std::path::PathBuf,
        /// Of an OCI image layout or a docker save archive holding several
        /// images, the one with this tag: the layout's ref name
        /// (`org.opencontainers.image.ref.name`), or one of the archive's
        /// RepoTags (`cairn/two:v1` matches `docker.io/cairn/two:v1`).
        #[arg(long)]
        tag: Option<String>,
    },
    /// Pull an image from an OCI distribution registry: `name:tag`,
    /// `name@sha256:...` or `host[:port]/path/name:tag` (a name without a
    /// host is on Docker Hub). The image is named by the reference as given.
    Pull {
        reference: String,
        /// The image's name instead of the reference.
        #[arg(long)]
        name: Option<String>,
        /// Plain HTTP to the registry (a registry on loopback).
        #[arg(long)]
        insecure: bool,
        /// Log in as this user (basic auth, or for a bearer token).
        #[arg(long, env = "CAIRN_REGISTRY_USERNAME")]
        username: Option<String>,
        /// Read the password from standard input (else from
        /// CAIRN_REGISTRY_PASSWORD).
        #[arg(long, requires = "username")]
        password_stdin: bool,
    },
    /// Make a template: the task's image with the task's writable layer
    /// committed on top. Tasks created with `--image NAME` start from it
    /// at once, whatever its size.
    Commit {
        /// The task's id or name.
        task: String,
        /// The new image's name.
        name: String,
        /// The snapshot to commit; by default a new snapshot of the running
        /// task (its latest when it is not running).
        #[arg(long)]
        from: Option<String>,
    },
    /// Remove an image no task and no template uses (its layers no other
    /// image has go with it).
    Rm { name: String },
}

pub(crate) async fn run(client: &Client, cmd: ImageCmd, out: Out) -> Result<u8> {
    match cmd {
        ImageCmd::List => list(client, out).await,
        ImageCmd::Inspect { name } => inspect(client, name, out).await,
        ImageCmd::Import { name, path, tag } => import(client, name, path, tag, out).await,
        ImageCmd::Pull { reference, name, insecure, username, password_stdin } => {
            pull(client, api::images::PullRequest { reference, name, insecure, username, password: None }, password_stdin, out).await
        }
        ImageCmd::Commit { task, name, from } => commit(client, api::images::CommitRequest { task, name, from }, out).await,
        ImageCmd::Rm { name } => rm(client, name, out).await,
    }
}

pub(crate) async fn list(client: &Client, out: Out) -> Result<u8> {
    let v: Answer<Vec<Image>> = client.get("/v1/images").await?;
    out.print(&v, |v| output::image_table(v));
    Ok(0)
}

pub(crate) async fn inspect(client: &Client, name: String, out: Out) -> Result<u8> {
    let v: Answer<ImageDetail> = client.get(&format!("/v1/images/{name}")).await?;
    out.print(&v, output::image_detail);
    Ok(0)
}

pub(crate) async fn import(client: &Client, name: String, path: std::path::PathBuf, tag: Option<String>, out: Out) -> Result<u8> {
    let abs = std::fs::canonicalize(&path).with_context(|| format!("cannot import {}", path.display()))?;
    let path = abs.to_str().ok_or_else(|| anyhow!("cannot import {}: the path is not UTF-8", abs.display()))?.to_owned();
    let req = api::images::ImportRequest { name: name.clone(), path, tag };
    let v: Answer<Image> = progress::while_importing(client, &name, client.post("/v1/images", &req)).await?;
    out.print(&v, |v| {
        let d = &v.dropped;
        let layers = if v.layers.is_empty() { String::new() } else { format!("{} layers, ", v.layers.len()) };
        format!(
            "imported {} ({layers}{} entries, {}; dropped {} device nodes, {} fifos/sockets, {} setuid/setgid bits)",
            v.name,
            v.files,
            progress::human(v.size_bytes as f64),
            d.devices,
            d.fifos_sockets,
            d.setid
        )
    });
    Ok(0)
}

pub(crate) async fn commit(client: &Client, req: api::images::CommitRequest, out: Out) -> Result<u8> {
    let task = req.task.clone();
    let v: Answer<Image> = progress::while_running(client, &task, client.post("/v1/images/commit", &req)).await?;
    out.print(&v, |v| {
        format!(
            "committed {} from {} ({} entries, {} in all; parent {})",
            v.name,
            v.source,
            v.files,
            progress::human(v.size_bytes as f64),
            v.parent.as_deref().unwrap_or("?")
        )
    });
    Ok(0)
}

pub(crate) async fn pull(client: &Client, mut req: api::images::PullRequest, password_stdin: bool, out: Out) -> Result<u8> {
    if req.username.is_some() {
        let password = if password_stdin {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).context("cannot read the password from standard input")?;
            line.trim_end_matches(['\n', '\r']).to_owned()
        } else {
            std::env::var("CAIRN_REGISTRY_PASSWORD").map_err(|_| anyhow!("a username needs a password: give --password-stdin or set CAIRN_REGISTRY_PASSWORD"))?
        };
        req.password = Some(password);
    }
    let name = req.name.clone().unwrap_or_else(|| req.reference.clone());
    let v: Answer<Image> = progress::while_pulling(client, &name, client.post("/v1/images/pull", &req)).await?;
    out.print(&v, |v| {
        format!(
            "pulled {} ({} layers, {} entries, {}; manifest {})",
            v.name,
            v.layers.len(),
            v.files,
            progress::human(v.size_bytes as f64),
            v.manifest_digest.as_deref().unwrap_or("?")
        )
    });
    Ok(0)
}

pub(crate) async fn rm(client: &Client, name: String, out: Out) -> Result<u8> {
    let v: Answer<Removed> = client.delete(&format!("/v1/images/{}", crate::client::segment_escape(&name))).await?;
    out.print(&v, |v| format!("removed image {}", v.removed));
    Ok(0)
}
