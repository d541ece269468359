//! The web console: server-rendered pages over the runtime, to watch and
//! steer tasks from a browser.
//!
//! - [`session`]: logging in with the API token into a cookie, and the
//!   per-session token every form carries (CSRF).
//! - [`headers`]: the security headers every page is sent with (also the
//!   approval page's, in `cairn-server`).
//! - [`tasks`], [`timeline`], [`snapshots`], [`deliveries`], [`approvals`],
//!   [`system`]: the pages; each
//!   handler reads through [`Runtime`] methods and renders with [`layout`]
//!   (charts as inline SVG with [`charts`]).
//!
//! Pages are complete without JavaScript; one small script (served from
//! `/console/assets/`, as the Content-Security-Policy allows no inline
//! script) only adds the timeline's live updates.
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | / | the task list: filters, paging |
//! | GET, POST | /console/login | the login form; the token into a session cookie |
//! | POST | /console/logout | ends the session |
//! | GET | /console/tasks/{id} | a task's timeline |
//! | GET | /console/tasks/{id}/live?after=SEQ | the timeline's new rows as server-sent events |
//! | GET | /console/tasks/{id}/ledger | the hash chain verified (`?part=verdict`: the verdict alone) |
//! | GET | /console/tasks/{id}/snapshots | the task's snapshots |
//! | GET | /console/tasks/{id}/diff?a=S&b=S[&path=P] | the changed paths as a tree; one file's change |
//! | GET | /console/deliveries/{record} | a delivery record verified, its deliverables |
//! | GET | /console/deliverables/{sha256}?name=N | a deliverable (or `kind=record`, the record) as a download |
//! | GET | /console/approvals | pending approvals with their context |
//! | POST | /console/approvals/{task} | approve or reject |
//! | GET | /console/system | charts from the metrics, the nodes, the images and templates |
//! | GET | /console/assets/{file} | the style sheet and the script |

pub mod approvals;
pub mod charts;
pub mod deliveries;
pub mod headers;
pub mod layout;
pub mod session;
pub mod snapshots;
pub mod system;
pub mod tasks;
pub mod timeline;

use std::sync::Arc;

use axum::extract::FromRef;
use axum::middleware;
use axum::routing::{get, post};
use axum::Router;
use cairn_runtime::Runtime;

use session::Sessions;

/// What every console handler gets.
#[derive(Clone, Debug)]
pub struct Console {
    pub rt: Arc<Runtime>,
    pub sessions: Arc<Sessions>,
}

impl FromRef<Console> for Arc<Runtime> {
    fn from_ref(c: &Console) -> Arc<Runtime> {
        c.rt.clone()
    }
}

/// The console's routes, for the daemon to merge into its router. `token`
/// is the API token: the one a person logs in with.
pub fn router<S: Clone + Send + Sync + 'static>(rt: Arc<Runtime>, token: Arc<String>) -> Router<S> {
    let console = Console { rt, sessions: Arc::new(Sessions::new(token)) };
    let private = Router::new()
        .route("/", get(tasks::list))
        .route("/console/tasks/{id}", get(timeline::show))
        .route("/console/tasks/{id}/live", get(timeline::live))
        .route("/console/tasks/{id}/output", get(timeline::output))
        .route("/console/tasks/{id}/ledger", get(timeline::ledger))
        .route("/console/tasks/{id}/snapshots", get(snapshots::list))
        .route("/console/tasks/{id}/diff", get(snapshots::diff))
        .route("/console/deliveries/{record}", get(deliveries::show))
        .route("/console/deliverables/{sha256}", get(deliveries::download))
        .route("/console/approvals", get(approvals::list))
        .route("/console/system", get(system::show))
        .route("/console/approvals/{task}", post(approvals::decide))
        .route("/console/logout", post(session::logout))
        .layer(middleware::from_fn_with_state(console.clone(), session::require));
    Router::new()
        .route("/console/login", get(session::login_page).post(session::login))
        .route("/console/assets/{file}", get(layout::asset))
        .merge(private)
        .layer(middleware::map_response(headers::console))
        .with_state(console)
}
