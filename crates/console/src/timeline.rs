//! A task's page: what it is and waits for, the ledger's verdict, and its
//! timeline from the event log (commands with exit codes and durations,
//! snapshots, rollbacks with their reasons, waits and wakes, egress
//! decisions, deliveries), kept live by server-sent events of rendered
//! rows.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use cairn_api::{Event, EventKind};
use futures_util::StreamExt;
use maud::{html, Markup};
use serde::Deserialize;
use serde_json::Value;

use crate::layout::{self, duration, page, Section};
use crate::session::Session;
use crate::Console;

/// Events on one page of a timeline.
pub const PAGE_EVENTS: usize = 200;

#[derive(Debug, Deserialize)]
pub struct TimelineQuery {
    /// Show the events before this seq (an older page); default the newest.
    before: Option<u64>,
}

/// A one-line account of an event, by kind.
fn headline(e: &Event) -> String {
    let a = &e.args;
    let s = |k: &str| a.get(k).and_then(Value::as_str).unwrap_or("");
    let phase = s("phase");
    let error = a.get("error").and_then(Value::as_str).map(|e| format!(" failed: {e}")).unwrap_or_default();
    match e.kind {
        EventKind::Exec => {
            let argv: Vec<&str> = a.get("argv").and_then(Value::as_array).map(|v| v.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
            format!("$ {}", argv.join(" "))
        }
        EventKind::Snapshot => {
            let note = s("note");
            format!("snapshot {} ({}){}{}", s("snapshot"), s("kind"), if note.is_empty() { String::new() } else { format!(": {note}") }, error)
        }
        EventKind::Rollback if phase == "begin" => format!("rollback to {} begins: {}", s("to"), s("reason")),
        EventKind::Rollback => format!("rolled back to {}{}", s("to"), error),
        EventKind::Wait if a.get("cancelled").is_some() => format!("wait {} cancelled", s("wait")),
        EventKind::Wait => format!("waits for {}", a.get("for").map(describe_wait).unwrap_or_default()),
        EventKind::Suspend if phase == "begin" => format!("suspending: {}", s("reason")),
        EventKind::Suspend => format!("suspended{}", error),
        EventKind::Wake => {
            let latency = a.get("wake_ms").or_else(|| a.get("latency_ms")).and_then(Value::as_u64).map(|ms| format!(" in {}", duration(ms))).unwrap_or_default();
            format!("woken by {}{latency}{error}", s("trigger"))
        }
        EventKind::EventReceived => format!("event {:?} received", s("name")),
        EventKind::Egress => format!("egress {} {} {}", s("verdict"), s("host"), s("reason")),
        EventKind::Delivery => format!("delivered: record {}", s("record_id")),
        _ => e.kind.as_str().replace('_', " "),
    }
}

fn describe_wait(w: &Value) -> String {
    let kind = w.get("kind").or_else(|| w.get("type")).and_then(Value::as_str).unwrap_or("");
    match w.get("prompt").and_then(Value::as_str) {
        Some(p) => format!("{kind}: {p}"),
        None => kind.to_owned(),
    }
}

/// One row of the timeline; the live stream sends the same markup.
pub fn row(e: &Event) -> Markup {
    let failed = e.exit_code.is_some_and(|c| c != 0) || e.args.get("error").is_some();
    html! {
        li class={ "ev " (e.kind.as_str()) @if failed { " failed" } } id={ "ev-" (e.seq) } {
            span.seq { (e.seq) }
            time title=(layout::utc(e.time_ms)) { (layout::utc(e.time_ms)) }
            span.kind { (e.kind.as_str()) }
            span.what {
                (headline(e))
                @if let Some(record) = e.args.get("record_id").and_then(Value::as_str).filter(|_| e.kind == EventKind::Delivery) {
                    " · " a href={ "/console/deliveries/" (record) } { "the record, verified" }
                }
            }
            @if let Some(code) = e.exit_code { span.exit title="exit code" { "exit " (code) } }
            @if let Some(ms) = e.duration_ms { span.dur { (duration(ms)) } }
            span.actor { (e.actor) }
            details {
                summary { "details" }
                pre { (serde_json::to_string_pretty(&e.args).unwrap_or_default()) }
            }
        }
    }
}

async fn render(console: &Console, session: &Session, id: &str, before: Option<u64>) -> Response {
    // One more than a page: whether there are older events.
    let (view, mut events) = match (console.rt.show(id).await, console.rt.events_page(id, before, PAGE_EVENTS as u64 + 1).await) {
        (Ok(view), Ok(events)) => (view, events),
        (Err(e), _) | (_, Err(e)) => return not_found_or(session, e),
    };
    let older = events.len() > PAGE_EVENTS;
    if older {
        events.remove(0);
    }
    let task = &view.task;
    let last_seq = events.last().map_or(0, |e| e.seq);
    let title = task.name.clone().unwrap_or_else(|| task.id.to_string());
    let ledger = format!("/console/tasks/{}/ledger", task.id.as_str());
    page(
        &title,
        session,
        Section::Tasks,
        html! {
            h1 { (title) " " span class={ "state " (task.state.as_str()) } #state { (task.state.as_str()) } }
            dl.meta {
                dt { "Id" } dd { code { (task.id.as_str()) } }
                dt { "Image" } dd { (task.config.image) }
                dt { "Isolation" } dd { (task.config.isolation.as_str()) }
                dt { "Node" } dd { (task.node.as_deref().unwrap_or("-")) }
                dt { "Step" } dd { (task.step) }
                dt { "Created" } dd { (layout::utc(task.created_ms)) }
                dt { "Snapshots" } dd { a href={ "/console/tasks/" (task.id.as_str()) "/snapshots" } { "the list, and what changed between two" } }
                @if let Some(w) = &view.pending_wait {
                    dt { "Waits for" } dd.prompt { (describe_wait(&serde_json::to_value(&w.what).unwrap_or_default())) }
                }
                @if let Some(r) = &task.rollback_note {
                    dt { "Last rollback" } dd { (serde_json::to_string(r).unwrap_or_default()) }
                }
                dt { "Ledger" }
                // The whole chain is walked to verify it: on its own page,
                // which the script fetches into this place.
                dd #ledger data-src={ (ledger) "?part=verdict" } { a href=(ledger) { "verify the hash chain" } }
            }
            @if before.is_none() {
                section #running data-live={ "/console/tasks/" (task.id.as_str()) "/output" } {
                    h2 { "Running now" }
                    p.hint { "The output of commands appears here as they run (with JavaScript on); the timeline below has each one's end." }
                }
            }
            h2 { "Timeline" }
            @if older {
                @if let Some(first) = events.first() {
                    p { a href={ "/console/tasks/" (task.id.as_str()) "?before=" (first.seq) } { "← older events" } }
                }
            }
            ol.timeline data-live=[before.is_none().then(|| format!("/console/tasks/{}/live?after={last_seq}", task.id.as_str()))] {
                @for e in &events { (row(e)) }
            }
            @if before.is_some() { p { a href={ "/console/tasks/" (task.id.as_str()) } { "newest events →" } } }
        },
    )
    .into_response()
}

#[derive(Debug, Deserialize)]
pub struct LedgerQuery {
    /// `verdict`: only the verdict's markup, for the timeline's script.
    part: Option<String>,
}

/// The ledger's verdict: the hash chain walked and every signed
/// checkpoint checked.
fn verdict(l: &Result<cairn_api::ledger::LedgerView, cairn_runtime::Error>) -> Markup {
    html! {
        @match l {
            Ok(l) if l.ok => span.ok { "verified: " (l.entries) " entries, " (l.checkpoints) " signed checkpoints" },
            Ok(l) => span.no { "does not verify: " (l.problem.as_deref().unwrap_or("")) },
            Err(e) => span.no { "cannot be read: " (e) },
        }
    }
}

pub async fn ledger(State(console): State<Console>, Extension(session): Extension<Session>, Path(id): Path<String>, Query(q): Query<LedgerQuery>) -> Response {
    let report = console.rt.ledger_report(&id).await;
    if q.part.as_deref() == Some("verdict") {
        return verdict(&report).into_response();
    }
    if let Err(e) = &report {
        if matches!(e, cairn_runtime::Error::NotFound(_)) {
            return layout::error_page(StatusCode::NOT_FOUND, &session, Section::Tasks, &e.to_string());
        }
    }
    let body = html! {
        h1 { "Ledger of " code { (id) } }
        p { (verdict(&report)) }
        @if let Ok(l) = &report {
            dl.meta {
                dt { "Entries" } dd { (l.entries) }
                dt { "Head" } dd { code { (l.head.as_deref().unwrap_or("-")) } }
                dt { "Signed checkpoints" } dd { (l.checkpoints) }
            }
        }
        p { a href={ "/console/tasks/" (id) } { "← the timeline" } }
    };
    page("Ledger", &session, Section::Tasks, body).into_response()
}

fn not_found_or(session: &Session, e: cairn_runtime::Error) -> Response {
    let status = if matches!(e, cairn_runtime::Error::NotFound(_)) { StatusCode::NOT_FOUND } else { StatusCode::INTERNAL_SERVER_ERROR };
    layout::error_page(status, session, Section::Tasks, &e.to_string())
}

pub async fn show(State(console): State<Console>, Extension(session): Extension<Session>, Path(id): Path<String>, Query(q): Query<TimelineQuery>) -> Response {
    render(&console, &session, &id, q.before).await
}

#[derive(Debug, Deserialize)]
pub struct LiveQuery {
    after: Option<u64>,
}

/// The timeline's new rows as server-sent events (name `row`, id the
/// event's seq, data the row's HTML); a reconnecting browser's
/// `Last-Event-ID` goes before `after`.
pub async fn live(State(console): State<Console>, Path(id): Path<String>, Query(q): Query<LiveQuery>, headers: HeaderMap) -> Response {
    let resumed = headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let after = resumed.or(q.after).unwrap_or(0);
    let events = match console.rt.watch(&id, after).await {
        Ok(events) => events,
        Err(e) => {
            let status = if matches!(e, cairn_runtime::Error::NotFound(_)) { StatusCode::NOT_FOUND } else { StatusCode::SERVICE_UNAVAILABLE };
            return layout::error_json(status, &e.to_string());
        }
    };
    let stream = events.map(|e| match e {
        Ok(e) => Ok::<_, std::io::Error>(Sse::default().event("row").id(e.seq.to_string()).data(row(&e).into_string().replace('\n', " "))),
        Err(e) => Err(std::io::Error::other(e.to_string())),
    });
    axum::response::sse::Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// The output of the task's commands as it comes, as server-sent events
/// named `started`, `output`, `exited` (a [`cairn_runtime::LiveOutput`] as
/// JSON) and `missed` (`{"missed": N}`, chunks a slow page did not get).
/// The script writes it into the page as text, never as markup.
pub async fn output(State(console): State<Console>, Path(id): Path<String>) -> Response {
    let items = match console.rt.watch_output(&id).await {
        Ok(items) => items,
        Err(e) => {
            let status = if matches!(e, cairn_runtime::Error::NotFound(_)) { StatusCode::NOT_FOUND } else { StatusCode::SERVICE_UNAVAILABLE };
            return layout::error_json(status, &e.to_string());
        }
    };
    let stream = items.map(|item| {
        let (name, data) = match item {
            cairn_runtime::LiveOutputItem::Output(out) => {
                let name = match &out {
                    cairn_runtime::LiveOutput::Started { .. } => "started",
                    cairn_runtime::LiveOutput::Output { .. } => "output",
                    cairn_runtime::LiveOutput::Exited { .. } => "exited",
                };
                (name, serde_json::to_string(&out).unwrap_or_default())
            }
            cairn_runtime::LiveOutputItem::Missed(n) => ("missed", serde_json::json!({ "missed": n }).to_string()),
        };
        Ok::<_, std::convert::Infallible>(Sse::default().event(name).data(data))
    });
    axum::response::sse::Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(kind: EventKind, args: Value, exit_code: Option<i32>) -> Event {
        serde_json::from_value(json!({
            "seq": 7, "task": "tabc23456789", "time_ms": 0, "kind": kind.as_str(), "actor": "cli",
            "args": args, "exit_code": exit_code, "duration_ms": 1500,
        }))
        .expect("an event")
    }

    #[test]
    fn rows_say_what_happened_and_escape_it() {
        let e = event(EventKind::Exec, json!({ "argv": ["sh", "-c", "echo <script>alert(1)</script>"] }), Some(2));
        let r = row(&e).into_string();
        assert!(r.contains("$ sh -c echo &lt;script&gt;alert(1)&lt;/script&gt;"), "{r}");
        assert!(!r.contains("<script>"), "{r}");
        assert!(r.contains("exit 2") && r.contains("1.5 s") && r.contains(" failed"), "{r}");
        let rb = row(&event(EventKind::Rollback, json!({ "phase": "begin", "to": "s1", "reason": "tests failed" }), Some(0))).into_string();
        assert!(rb.contains("rollback to s1 begins: tests failed"), "{rb}");
        assert!(!rb.contains(" failed\""), "exit 0 is no failure: {rb}");
    }
}
