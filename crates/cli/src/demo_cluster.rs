//! A throwaway cluster for `cairn demo`: a PostgreSQL server and an
//! S3-compatible server (moto) on loopback, each in a temporary directory,
//! and two `cairn serve` nodes sharing them. Everything it starts is
//! stopped and removed when it is dropped, also after a failed step.
//!
//! It needs what `scripts/setup-debian.sh` installs: PostgreSQL's server
//! programs (Debian's `postgresql`) and the `moto[server]` Python package.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::client::Client;

const BUCKET: &str = "cairn-demo";

/// One node of the demo cluster.
pub struct Node {
    pub name: String,
    pub client: Client,
    /// The API token in the node's home.
    pub token: String,
    child: Child,
}

pub struct Cluster {
    pub nodes: Vec<Node>,
    postgres: Child,
    moto: Child,
    dir: PathBuf,
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

/// PostgreSQL's server programs: Debian's newest `/usr/lib/postgresql/N/bin`, else `PATH`.
fn pg_bin() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin): &(u32, PathBuf)| bin.join("initdb").exists())
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b).unwrap_or_default()
}

/// `program`, run as the `postgres` user (PostgreSQL refuses to run as
/// root), itself the child: signals reach it, not a wrapper.
fn as_postgres(program: PathBuf) -> Result<Command> {
    use std::os::unix::process::CommandExt;
    let user = nix::unistd::User::from_name("postgres")?.context("no postgres user: install Debian's postgresql (scripts/setup-debian.sh does)")?;
    let mut cmd = Command::new(program);
    cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
    Ok(cmd)
}

/// Polls `ready` every 50 ms for up to `limit`.
fn wait_for(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + limit;
    while !ready() {
        if Instant::now() > deadline {
            bail!("{what} did not come up within {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

impl Cluster {
    /// Starts the servers and the nodes `names`, in `dir` (created).
    pub async fn start(dir: &Path, names: &[&str]) -> Result<Cluster> {
        std::fs::create_dir_all(dir)?;
        let bin = pg_bin();
        let data = dir.join("pg");
        std::fs::create_dir_all(&data)?;
        Command::new("chown").args(["-R", "postgres"]).arg(dir).status().context("chown for PostgreSQL")?;
        let out = as_postgres(bin.join("initdb"))?
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync"])
            .output()
            .context("cannot run PostgreSQL's initdb: install Debian's postgresql (scripts/setup-debian.sh does)")?;
        if !out.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let pg_port = free_port()?;
        let postgres = as_postgres(bin.join("postgres"))?
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(dir)
            .args(["-h", "127.0.0.1", "-p", &pg_port.to_string(), "-c", "fsync=off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("postgres.log"))?)
            .spawn()
            .context("cannot start postgres")?;
        let moto_port = free_port()?;
        let moto = Command::new("python3")
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &moto_port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("moto.log"))?)
            .spawn()
            .context("cannot start moto (pip install 'moto[server]'; scripts/setup-debian.sh does)")?;
        let mut cluster = Cluster { nodes: Vec::new(), postgres, moto, dir: dir.to_owned() };
        let endpoint = format!("http://127.0.0.1:{moto_port}");
        let http = reqwest::Client::new();
        let pg_ready = |port: u16| Command::new(bin.join("pg_isready")).args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()]).status().is_ok_and(|s| s.success());
        wait_for("PostgreSQL", Duration::from_secs(30), || pg_ready(pg_port))?;
        let created = Command::new(bin.join("createdb")).args(["-h", "127.0.0.1", "-p", &pg_port.to_string(), "-U", "postgres", "cairn"]).status()?;
        if !created.success() {
            bail!("createdb failed");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // A bucket; moto answers once it is up.
            if http.put(format!("{endpoint}/{BUCKET}")).send().await.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            if Instant::now() > deadline {
                bail!("moto did not come up within 30 s: {}", std::fs::read_to_string(dir.join("moto.log")).unwrap_or_default());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let exe = std::env::current_exe()?;
        for name in names {
            let home = dir.join(name);
            let mut child = Command::new(&exe)
                .args(["serve", "--listen", "127.0.0.1:0", "--node", name, "--blob", &format!("s3://{BUCKET}/demo")])
                .args(["--store", &format!("postgres://postgres@127.0.0.1:{pg_port}/cairn")])
                .env("CAIRN_HOME", &home)
                .envs([("AWS_ENDPOINT_URL", endpoint.as_str()), ("AWS_ACCESS_KEY_ID", "demo"), ("AWS_SECRET_ACCESS_KEY", "demo")])
                .envs([("AWS_REGION", "us-east-1"), ("AWS_ALLOW_HTTP", "true")])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join(format!("{name}.log")))?)
                .spawn()
                .context("cannot start a node")?;
            let url_file = home.join("url");
            let up = wait_for(&format!("node {name}"), Duration::from_secs(60), || url_file.exists() || matches!(child.try_wait(), Ok(Some(_))));
            if up.is_err() || matches!(child.try_wait(), Ok(Some(_))) {
                let _ = child.kill();
                let _ = child.wait();
                bail!("node {name} did not start: {}", std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default());
            }
            let url = std::fs::read_to_string(&url_file)?.trim().to_owned();
            let token = std::fs::read_to_string(home.join("token"))?.trim().to_owned();
            cluster.nodes.push(Node { name: name.to_string(), client: Client::new(url, token.clone()), token, child });
        }
        Ok(cluster)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SIGINT is PostgreSQL's fast shutdown; the others stop on it too.
        let term = |c: &mut Child| {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGINT);
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        };
        for n in &mut self.nodes {
            term(&mut n.child);
        }
        term(&mut self.postgres);
        term(&mut self.moto);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
