//! The system page: charts from the metrics (tasks by state, wake
//! latency, egress decisions), the nodes sharing the store, and the
//! images and templates tasks start from.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::html;

use crate::charts::{bars, histogram_ms, samples};
use crate::layout::{self, ago, page, Section};
use crate::session::Session;
use crate::Console;

/// Bytes for people: `1.5 MiB`.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{v:.1} {}", UNITS[unit]) }
}

pub async fn show(State(console): State<Console>, Extension(session): Extension<Session>) -> Response {
    let rt = &console.rt;
    let (metrics, nodes, images) = match (rt.metrics_text().await, rt.nodes().await, rt.list_images().await) {
        (Ok(m), Ok(n), Ok(i)) => (m, n, i),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            return layout::error_page(StatusCode::INTERNAL_SERVER_ERROR, &session, Section::System, &e.to_string());
        }
    };
    let by_state: Vec<(String, f64)> =
        samples(&metrics, "cairn_tasks").into_iter().filter_map(|s| s.label.map(|(_, v)| (v.to_owned(), s.value))).collect();
    let egress: Vec<(String, f64)> =
        samples(&metrics, "cairn_egress_decisions_total").into_iter().filter_map(|s| s.label.map(|(_, v)| (v.to_owned(), s.value))).collect();
    let wakes = histogram_ms(&metrics, "cairn_wake_duration_seconds");
    let now = layout::now_ms();
    let body = html! {
        h1 { "System" }
        div.charts {
            (bars("Tasks by state", &by_state, ""))
            (bars("Wake latency (wakes since the daemon started)", &wakes, ""))
            (bars("Egress decisions (since the daemon started)", &egress, ""))
        }
        h2 { "Nodes" }
        table.tasks {
            thead { tr { th { "Node" } th { "State" } th { "URL" } th { "Version" } th { "Live sandboxes" } th { "Heartbeat" } th { "Started" } } }
            tbody {
                @for n in &nodes {
                    tr {
                        td { (n.name) }
                        td { span class={ "state " (n.state.as_str()) } { (n.state.as_str()) } }
                        td { code { (n.url) } }
                        td { (n.version) }
                        td { (n.load) }
                        td { (n.heartbeat_age_ms / 1000) " s ago" }
                        td title=(layout::utc(n.started_ms)) { (ago(n.started_ms, now)) " ago" }
                    }
                }
            }
        }
        h2 { "Images and templates" }
        table.tasks {
            thead { tr { th { "Name" } th { "Kind" } th { "Size" } th { "Files" } th { "Source" } th { "Created" } } }
            tbody {
                @for i in &images {
                    tr {
                        td { code { (i.name) } }
                        td { (format!("{:?}", i.kind).to_lowercase()) }
                        td { (size(i.size_bytes)) }
                        td { (i.files) }
                        td { (i.source) }
                        td title=(layout::utc(i.created_ms)) { (ago(i.created_ms, now)) " ago" }
                    }
                }
            }
        }
    };
    page("System", &session, Section::System, body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(size(512), "512 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(3 << 30), "3.0 GiB");
    }
}
