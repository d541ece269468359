//! The demo's notification receiver: a small HTTP/1.1 server on loopback
//! that answers every post with 200 and hands each request's headers and
//! body over, as a chat bot receiving Cairn's hooks would.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// One notification as it arrived.
pub(crate) struct Arrived {
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

pub(crate) struct Receiver {
    pub url: String,
    rx: mpsc::UnboundedReceiver<Arrived>,
}

impl Receiver {
    pub(crate) async fn start() -> Result<Receiver> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("cannot listen for the demo's notifications")?;
        let url = format!("http://{}/notify", listener.local_addr()?);
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    if let Ok(got) = read_request(conn).await {
                        let _ = tx.send(got);
                    }
                });
            }
        });
        Ok(Receiver { url, rx })
    }

    /// The next notification of type `kind` (others are passed over), at
    /// most 10 s away.
    pub(crate) async fn next_of(&mut self, kind: &str) -> Result<(Arrived, serde_json::Value)> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let got = tokio::time::timeout_at(deadline, self.rx.recv())
                .await
                .map_err(|_| anyhow!("no {kind} notification within 10 s"))?
                .ok_or_else(|| anyhow!("the demo's receiver stopped"))?;
            let v: serde_json::Value = serde_json::from_slice(&got.body).context("a notification that is not JSON")?;
            if v["type"] == kind {
                return Ok((got, v));
            }
        }
    }
}

async fn read_request(mut conn: tokio::net::TcpStream) -> Result<Arrived> {
    let (read, mut write) = conn.split();
    let mut reader = BufReader::new(read);
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).await?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let len: usize = headers.get("content-length").and_then(|l| l.parse().ok()).unwrap_or(0).min(1 << 20);
    let mut body = vec![0; len];
    reader.read_exact(&mut body).await?;
    write.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await?;
    Ok(Arrived { headers, body })
}
