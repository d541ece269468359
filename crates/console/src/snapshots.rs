//! A task's snapshots, and the diff between two of them: the changed
//! paths as a tree, each file's change on its own page (a unified diff
//! for text, sizes and hashes otherwise; a file over the runtime's read
//! limit by its size alone).

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use cairn_api::snapshots::{FileChange, FileSide};
use maud::{html, Markup};
use serde::Deserialize;

use crate::layout::{self, page, query_escape, Section};
use crate::session::Session;
use crate::Console;

fn status_of(e: &cairn_runtime::Error) -> StatusCode {
    match e {
        cairn_runtime::Error::NotFound(_) => StatusCode::NOT_FOUND,
        cairn_runtime::Error::Invalid(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn diff_link(task: &str, a: &str, b: &str, path: Option<&str>) -> String {
    let mut link = format!("/console/tasks/{task}/diff?a={}&b={}", query_escape(a), query_escape(b));
    if let Some(p) = path {
        link.push_str(&format!("&path={}", query_escape(p)));
    }
    link
}

pub async fn list(State(console): State<Console>, Extension(session): Extension<Session>, Path(id): Path<String>) -> Response {
    let snaps = match console.rt.list_snapshots(&id).await {
        Ok(s) => s,
        Err(e) => return layout::error_page(status_of(&e), &session, Section::Tasks, &e.to_string()),
    };
    let body = html! {
        h1 { "Snapshots of " a href={ "/console/tasks/" (id) } { code { (id) } } }
        @if snaps.is_empty() { p.empty { "No snapshot yet." } }
        table.tasks {
            thead { tr { th { "Snapshot" } th { "Kind" } th { "Note" } th { "Step" } th { "Files" } th { "Added" } th { "Freeze" } th { "Taken" } th { "Changes" } } }
            tbody {
                @for (i, s) in snaps.iter().enumerate().rev() {
                    tr {
                        td { code { (s.id.as_str()) } @if !s.healthy { " " span.no { "unhealthy" } } }
                        td { (s.kind.as_str()) }
                        td { (s.note) }
                        td { (s.step) }
                        td { (s.files) }
                        td { (s.added_bytes) " B" }
                        td { (format!("{:.1} ms", s.freeze_ms)) }
                        td { (layout::utc(s.created_ms)) }
                        td {
                            @if i > 0 {
                                a href=(diff_link(&id, snaps[i - 1].id.as_str(), s.id.as_str(), None)) { "since " code { (snaps[i - 1].id.as_str()) } }
                            }
                        }
                    }
                }
            }
        }
        @if snaps.len() > 1 {
            form.filters method="get" action={ "/console/tasks/" (id) "/diff" } {
                label { "From " select name="a" { @for s in &snaps { option value=(s.id.as_str()) { (s.id.as_str()) " (" (s.kind.as_str()) ")" } } } }
                label { "to " select name="b" { @for s in snaps.iter().rev() { option value=(s.id.as_str()) { (s.id.as_str()) " (" (s.kind.as_str()) ")" } } } }
                button type="submit" { "Compare" }
            }
        }
    };
    page("Snapshots", &session, Section::Tasks, body).into_response()
}

#[derive(Debug, Deserialize)]
pub struct DiffQuery {
    a: String,
    b: String,
    path: Option<String>,
}

/// Changed paths as nested directories: a directory's children by name.
#[derive(Default)]
struct Tree {
    children: BTreeMap<String, Tree>,
    /// `added`, `changed` or `deleted` for a path the diff names.
    change: Option<&'static str>,
}

impl Tree {
    fn insert(&mut self, path: &str, change: &'static str) {
        let mut node = self;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            node = node.children.entry(part.to_owned()).or_default();
        }
        node.change = Some(change);
    }

    fn render(&self, prefix: &str, link: &dyn Fn(&str) -> String) -> Markup {
        html! {
            ul.tree {
                @for (name, child) in &self.children {
                    @let full = format!("{prefix}/{name}");
                    li {
                        @match child.change {
                            Some(change) => { span class={ "change " (change) } { (change) } " " a href=(link(&full)) { (name) } }
                            None => span.dir { (name) "/" },
                        }
                        @if !child.children.is_empty() { (child.render(&full, link)) }
                    }
                }
            }
        }
    }
}

fn side(s: &Option<FileSide>) -> Markup {
    html! {
        @match s {
            None => td colspan="4" { "not in the writable layers (absent, or the image's own file)" },
            Some(s) => {
                td { (s.kind) @if let Some(t) = &s.target { " → " code { (t) } } }
                td { (s.size) " B" }
                td { code { (format!("{:o}", s.mode)) } }
                td { @match &s.blake3 { Some(h) => code { (h) }, None if s.kind == "file" => "not read (over the read limit)", None => "" } }
            }
        }
    }
}

/// A unified diff with its lines marked by kind.
fn unified(diff: &str) -> Markup {
    html! {
        pre.diff {
            @for line in diff.lines() {
                @let class = if line.starts_with("+++") || line.starts_with("---") { "head" } else if line.starts_with('+') { "add" } else if line.starts_with('-') { "del" } else if line.starts_with("@@") { "hunk" } else { "ctx" };
                span class=(class) { (line) } "\n"
            }
        }
    }
}

fn file_page(task: &str, a: &str, b: &str, c: &FileChange) -> Markup {
    html! {
        h1 { code { (c.path) } }
        p { "From " code { (a) } " to " code { (b) } " · " a href=(diff_link(task, a, b, None)) { "all changes" } }
        table.tasks {
            thead { tr { th { "" } th { "Kind" } th { "Size" } th { "Mode" } th { "BLAKE3" } } }
            tbody {
                tr { th { (a) } (side(&c.before)) }
                tr { th { (b) } (side(&c.after)) }
            }
        }
        @match &c.text_diff {
            Some(d) if d.is_empty() => p.empty { "The contents are the same (the change is in its metadata)." },
            Some(d) => (unified(d)),
            None => p.hint { "Binary, or too large to read: compare the sizes and hashes above." },
        }
    }
}

pub async fn diff(State(console): State<Console>, Extension(session): Extension<Session>, Path(id): Path<String>, Query(q): Query<DiffQuery>) -> Response {
    if let Some(path) = &q.path {
        return match console.rt.diff_file(&id, &q.a, &q.b, path).await {
            Ok(c) => page("Change", &session, Section::Tasks, file_page(&id, &q.a, &q.b, &c)).into_response(),
            Err(e) => layout::error_page(status_of(&e), &session, Section::Tasks, &e.to_string()),
        };
    }
    let d = match console.rt.diff(&id, &q.a, &q.b).await {
        Ok(d) => d,
        Err(e) => return layout::error_page(status_of(&e), &session, Section::Tasks, &e.to_string()),
    };
    let mut tree = Tree::default();
    for (list, change) in [(&d.added, "added"), (&d.changed, "changed"), (&d.deleted, "deleted")] {
        for p in list {
            tree.insert(p, change);
        }
    }
    let link = |p: &str| diff_link(&id, &q.a, &q.b, Some(p));
    let total = d.added.len() + d.changed.len() + d.deleted.len();
    let body = html! {
        h1 { "Changes of " a href={ "/console/tasks/" (id) } { code { (id) } } }
        p { "From " code { (q.a) } " to " code { (q.b) } ": " (d.added.len()) " added, " (d.changed.len()) " changed, " (d.deleted.len()) " deleted · "
            a href={ "/console/tasks/" (id) "/snapshots" } { "all snapshots" } }
        @if total == 0 { p.empty { "Nothing changed." } } @else { (tree.render("", &link)) }
    };
    page("Changes", &session, Section::Tasks, body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_nests_paths_and_escapes_names() {
        let mut t = Tree::default();
        t.insert("/workspace/src/a.rs", "changed");
        t.insert("/workspace/src/<b>.rs", "added");
        t.insert("/workspace/old", "deleted");
        let html = t.render("", &|p| format!("/x?path={}", query_escape(p))).into_string();
        assert!(html.contains("<span class=\"dir\">workspace/</span>"), "{html}");
        assert!(html.contains("<a href=\"/x?path=/workspace/src/a.rs\">a.rs</a>"), "{html}");
        assert!(html.contains("&lt;b&gt;.rs") && !html.contains("<b>"), "{html}");
        assert!(html.contains("/x?path=/workspace/src/%3Cb%3E.rs"), "{html}");
    }

    #[test]
    fn unified_diff_lines_are_marked_and_escaped() {
        let html = unified("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-<old>\n+new\n same\n").into_string();
        assert!(html.contains("<span class=\"del\">-&lt;old&gt;</span>"), "{html}");
        assert!(html.contains("<span class=\"add\">+new</span>") && html.contains("<span class=\"hunk\">"), "{html}");
    }
}
