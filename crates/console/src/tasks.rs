//! The task list: newest first, filtered by state, by name or id, and by
//! a metadata label, a page at a time.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use cairn_api::TaskState;
use maud::html;
use serde::Deserialize;

use crate::layout::{self, ago, page, query_escape, Section};
use crate::session::Session;
use crate::Console;

/// Rows on a page.
pub const PAGE_SIZE: usize = 50;

#[derive(Debug, Default, Deserialize)]
pub struct Filters {
    /// A task state (`running`, `waiting`, ...); empty for all.
    #[serde(default)]
    pub state: String,
    /// Part of the task's name or id.
    #[serde(default)]
    pub q: String,
    /// `key=value`: a metadata label the task carries.
    #[serde(default)]
    pub meta: String,
    /// The page, from 1.
    #[serde(default)]
    pub page: Option<usize>,
}

impl Filters {
    /// The query string of these filters on another page.
    fn link(&self, page: usize) -> String {
        format!("/?state={}&q={}&meta={}&page={page}", query_escape(&self.state), query_escape(&self.q), query_escape(&self.meta))
    }
}

/// The states a filter can pick, in their life's order.
fn states() -> impl Iterator<Item = &'static str> {
    TaskState::ALL.iter().map(|s| s.as_str())
}

pub async fn list(State(console): State<Console>, Extension(session): Extension<Session>, Query(f): Query<Filters>) -> Response {
    if !f.state.is_empty() && !states().any(|s| s == f.state) {
        let known = states().collect::<Vec<_>>().join(", ");
        return layout::error_page(StatusCode::BAD_REQUEST, &session, Section::Tasks, &format!("no task state {:?}: the states are {known}", f.state));
    }
    let state = TaskState::ALL.into_iter().find(|s| s.as_str() == f.state);
    let page_no = f.page.unwrap_or(1).max(1);
    let offset = (page_no - 1).saturating_mul(PAGE_SIZE) as u64;
    let text = Some(f.q.trim()).filter(|q| !q.is_empty());
    let meta = Some(f.meta.trim()).filter(|m| !m.is_empty());
    let (rows, total) = match console.rt.list_page(state, text, meta, offset, PAGE_SIZE as u64).await {
        Ok(page) => page,
        Err(e) => return layout::error_page(StatusCode::INTERNAL_SERVER_ERROR, &session, Section::Tasks, &e.to_string()),
    };
    let total = total as usize;
    let pages = total.div_ceil(PAGE_SIZE).max(1);
    let now = layout::now_ms();
    let body = html! {
        h1 { "Tasks" }
        form.filters method="get" action="/" role="search" {
            label { "State "
                select name="state" {
                    option value="" { "any" }
                    @for s in states() { option value=(s) selected[f.state == s] { (s) } }
                }
            }
            label { "Name or id " input type="search" name="q" value=(f.q); }
            label { "Label " input type="search" name="meta" value=(f.meta) placeholder="key=value"; }
            button type="submit" { "Filter" }
        }
        p.count { (total) " tasks" @if pages > 1 { ", page " (page_no) " of " (pages) } }
        table.tasks {
            thead { tr { th { "Task" } th { "State" } th { "Image" } th { "Isolation" } th { "Node" } th { "Age" } th { "Last activity" } } }
            tbody {
                @for t in &rows {
                    @let task = &t.task;
                    tr {
                        td {
                            a href={ "/console/tasks/" (task.id.as_str()) } {
                                @if let Some(n) = &task.name { (n) " " }
                                code { (task.id.as_str()) }
                            }
                        }
                        td { span class={ "state " (task.state.as_str()) } { (task.state.as_str()) } }
                        td { (task.config.image) }
                        td { (task.config.isolation.as_str()) }
                        td { (task.node.as_deref().unwrap_or("")) }
                        td title=(layout::utc(task.created_ms)) { (ago(task.created_ms, now)) }
                        td title=(layout::utc(task.last_activity_ms)) { (ago(task.last_activity_ms, now)) " ago" }
                    }
                }
            }
        }
        @if rows.is_empty() { p.empty { "No task matches." } }
        nav.pages aria-label="pages" {
            @if page_no > 1 { a rel="prev" href=(f.link(page_no - 1)) { "← newer" } }
            @if page_no < pages { a rel="next" href=(f.link(page_no + 1)) { "older →" } }
        }
    };
    page("Tasks", &session, Section::Tasks, body).into_response()
}
