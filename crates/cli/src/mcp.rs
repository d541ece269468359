//! `cairn mcp`: the Model Context Protocol over stdio, for clients that
//! start their servers as programs. The tools live in the daemon (they
//! need its runtime), so this is a bridge: each JSON-RPC message read from
//! stdin (one per line) is posted to the daemon's `/mcp` with the token,
//! and each message of the answer (a JSON body, or server-sent events) is
//! written to stdout, one per line. Requests are forwarded concurrently, so
//! a long `wait_for_approval` does not hold up the others. Diagnostics go
//! to stderr; at the end of stdin the bridge lets the calls in flight
//! answer, then exits 0.

use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Result};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::client::Client;

/// What later requests carry that earlier answers gave: the session id
/// (if the daemon hands one out) and the negotiated protocol version.
#[derive(Debug, Default)]
struct Negotiated {
    session: Option<String>,
    protocol: Option<String>,
}

/// Where a request's protocol version travels in the 2026-07-28 revision,
/// which has no initialize handshake.
const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";

pub async fn bridge(client: &Client) -> Result<u8> {
    // Found unreachable now rather than at the client's first message.
    client.get::<cairn_api::health::Health>("/v1/health").await?;
    let endpoint = client.url("/mcp");
    let http = reqwest::Client::new();
    let negotiated = Arc::new(Mutex::new(Negotiated::default()));
    let (out_tx, mut out_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    // One writer, so that concurrent answers never interleave in a line.
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = out_rx.recv().await {
            let written = async {
                stdout.write_all(line.as_bytes()).await?;
                stdout.write_all(b"\n").await?;
                stdout.flush().await
            };
            if let Err(e) = written.await {
                eprintln!("cairn mcp: cannot write to stdout: {e}");
                break;
            }
        }
    });
    let mut calls = tokio::task::JoinSet::new();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await.map_err(|e| anyhow!("reading stdin: {e}"))? {
        if line.trim().is_empty() {
            continue;
        }
        let call = Call { http: http.clone(), endpoint: endpoint.clone(), token: client.token.clone(), negotiated: negotiated.clone(), out: out_tx.clone() };
        calls.spawn(call.forward(line));
        // Finished calls are reaped as we go, so the set stays small.
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
    drop(out_tx);
    let _ = writer.await;
    Ok(0)
}

/// One message on its way to the daemon and back.
struct Call {
    http: reqwest::Client,
    endpoint: String,
    token: String,
    negotiated: Arc<Mutex<Negotiated>>,
    out: tokio::sync::mpsc::UnboundedSender<String>,
}

impl Call {
    async fn forward(self, line: String) {
        let message: Option<Value> = serde_json::from_str(&line).ok();
        let id = message.as_ref().and_then(|m| m.get("id")).cloned();
        let headers = {
            let negotiated = self.negotiated.lock().unwrap_or_else(|p| p.into_inner());
            forward_headers(message.as_ref(), &negotiated)
        };
        let sent = self.http.post(&self.endpoint).bearer_auth(&self.token).headers(headers).body(line).send().await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => return self.fail(id, &format!("cannot reach the daemon at {}: {e}", self.endpoint)),
        };
        let status = response.status();
        let session = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let is_sse = response.headers().get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|c| c.starts_with("text/event-stream"));
        let body = match response.text().await {
            Ok(b) => b,
            Err(e) => return self.fail(id, &format!("reading the daemon's answer: {e}")),
        };
        let answers = if is_sse { sse_data(&body) } else { json_messages(&body) };
        if answers.is_empty() && !status.is_success() {
            let why = body.lines().next().unwrap_or("").trim();
            return self.fail(id, &format!("the daemon answered {status}: {why}"));
        }
        {
            let mut negotiated = self.negotiated.lock().unwrap_or_else(|p| p.into_inner());
            if session.is_some() {
                negotiated.session = session;
            }
            // Recorded before the answer is written: the client sends
            // nothing more until it has read it.
            if message.as_ref().and_then(|m| m.get("method")).and_then(Value::as_str) == Some("initialize") {
                if let Some(v) = answers.iter().find_map(|a| a.pointer("/result/protocolVersion")?.as_str().map(str::to_owned)) {
                    negotiated.protocol = Some(v);
                }
            }
        }
        for answer in answers {
            let _ = self.out.send(answer.to_string());
        }
    }

    /// A request that got no answer from the daemon gets a JSON-RPC error,
    /// so its client is not left waiting; the reason also goes to stderr.
    fn fail(&self, id: Option<Value>, why: &str) {
        eprintln!("cairn mcp: {why}");
        if let Some(id) = id {
            let error = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": why}});
            let _ = self.out.send(error.to_string());
        }
    }
}

/// The headers of one forwarded message: what the streamable HTTP
/// transport asks of a client (`Accept`, the session and the protocol
/// version, and the method and name the message names, which servers
/// check against the body).
fn forward_headers(message: Option<&Value>, negotiated: &Negotiated) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let mut put = |name: &'static str, value: &str| {
        // Only visible ASCII goes in a header as is; anything else is left
        // out rather than encoded, and the body still says it.
        if value.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
            if let Ok(v) = HeaderValue::from_str(value) {
                headers.insert(HeaderName::from_static(name), v);
            }
        }
    };
    put("content-type", "application/json");
    put("accept", "application/json, text/event-stream");
    if let Some(s) = &negotiated.session {
        put("mcp-session-id", s);
    }
    let per_message = message.and_then(|m| m.pointer("/params/_meta")).and_then(|m| m.get(META_PROTOCOL_VERSION)).and_then(Value::as_str);
    if let Some(v) = per_message.or(negotiated.protocol.as_deref()) {
        put("mcp-protocol-version", v);
    }
    if let Some(method) = message.and_then(|m| m.get("method")).and_then(Value::as_str) {
        put("mcp-method", method);
        let name = match method {
            "tools/call" | "prompts/get" => message.and_then(|m| m.pointer("/params/name")),
            "resources/read" => message.and_then(|m| m.pointer("/params/uri")),
            _ => None,
        };
        if let Some(name) = name.and_then(Value::as_str) {
            put("mcp-name", name);
        }
    }
    headers
}

/// The JSON-RPC messages of a JSON body: one object, or a batch. Anything
/// else (the daemon's own error body, e.g. for a refused token) is none.
fn json_messages(body: &str) -> Vec<Value> {
    let found = match serde_json::from_str::<Value>(body) {
        Ok(Value::Array(batch)) => batch,
        Ok(v) => vec![v],
        Err(_) => Vec::new(),
    };
    found.into_iter().filter(|m| m.get("jsonrpc").is_some()).collect()
}

/// The JSON-RPC messages of a server-sent event stream: each event's data
/// lines joined; events without JSON data (priming, keep-alives) skipped.
fn sse_data(body: &str) -> Vec<Value> {
    let mut messages = Vec::new();
    for event in body.replace("\r\n", "\n").split("\n\n") {
        let data: Vec<&str> = event.lines().filter_map(|l| l.strip_prefix("data:")).map(|d| d.strip_prefix(' ').unwrap_or(d)).collect();
        if data.is_empty() {
            continue;
        }
        messages.extend(json_messages(&data.join("\n")));
    }
    messages
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
        h.get(name).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn a_tool_call_carries_method_name_and_the_negotiated_version() {
        let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "run_command", "arguments": {}}});
        let negotiated = Negotiated { session: Some("s1".into()), protocol: Some("2025-11-25".into()) };
        let h = forward_headers(Some(&call), &negotiated);
        assert_eq!(header(&h, "mcp-method"), Some("tools/call"));
        assert_eq!(header(&h, "mcp-name"), Some("run_command"));
        assert_eq!(header(&h, "mcp-protocol-version"), Some("2025-11-25"));
        assert_eq!(header(&h, "mcp-session-id"), Some("s1"));
        assert_eq!(header(&h, "accept"), Some("application/json, text/event-stream"));
    }

    #[test]
    fn a_per_message_version_wins_and_nothing_is_guessed_before_initialize() {
        let modern = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {META_PROTOCOL_VERSION: "2026-07-28"}}});
        let h = forward_headers(Some(&modern), &Negotiated { session: None, protocol: Some("2025-06-18".into()) });
        assert_eq!(header(&h, "mcp-protocol-version"), Some("2026-07-28"));
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}});
        let h = forward_headers(Some(&init), &Negotiated::default());
        assert_eq!(header(&h, "mcp-protocol-version"), None);
        assert_eq!(header(&h, "mcp-name"), None);
        // A line that is not JSON is still forwarded, for the server to refuse.
        assert_eq!(header(&forward_headers(None, &Negotiated::default()), "content-type"), Some("application/json"));
    }

    #[test]
    fn a_name_that_cannot_be_a_header_is_left_out() {
        let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "caf\u{e9}\n"}});
        assert_eq!(header(&forward_headers(Some(&call), &Negotiated::default()), "mcp-name"), None);
    }

    #[test]
    fn answers_are_read_from_json_bodies_and_event_streams() {
        assert_eq!(json_messages(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#).len(), 1);
        assert_eq!(json_messages(r#"[{"jsonrpc":"2.0","id":1},{"jsonrpc":"2.0","id":2}]"#).len(), 2);
        assert!(json_messages(r#"{"error":{"code":"unauthorized","message":"wrong bearer token"}}"#).is_empty());
        assert!(json_messages("").is_empty());
        let sse = "id: 0\nretry: 3000\ndata: \n\nevent: message\r\ndata: {\"jsonrpc\":\"2.0\",\r\ndata: \"id\":7,\"result\":{}}\r\n\r\n: keep-alive\n\n";
        let got = sse_data(sse);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0]["id"], 7);
    }
}
