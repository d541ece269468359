//! The routes the daemon serves, recorded as they are added: the OpenAPI
//! document's test holds this set against the documented one, so a route
//! cannot be served undocumented (or documented and not served).

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::handler::Handler;
use axum::routing::{on, MethodFilter};
use axum::Router;
use cairn_runtime::Runtime;

/// The HTTP methods the API uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verb {
    Get,
    Post,
    Put,
    Delete,
}

impl Verb {
    fn filter(self) -> MethodFilter {
        match self {
            Verb::Get => MethodFilter::GET,
            Verb::Post => MethodFilter::POST,
            Verb::Put => MethodFilter::PUT,
            Verb::Delete => MethodFilter::DELETE,
        }
    }

    /// As an OpenAPI path item names it.
    #[cfg(test)]
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::Post => "post",
            Verb::Put => "put",
            Verb::Delete => "delete",
        }
    }
}

/// A router and the (path, method) pairs it serves. Routes are only added
/// through [`Routes::get`] and its siblings, which record what they add.
#[derive(Debug)]
pub(crate) struct Routes {
    router: Router<Arc<Runtime>>,
    served: BTreeSet<(&'static str, Verb)>,
}

impl Routes {
    pub(crate) fn new() -> Routes {
        Routes { router: Router::new(), served: BTreeSet::new() }
    }

    pub(crate) fn get<H: Handler<T, Arc<Runtime>>, T: 'static>(self, path: &'static str, handler: H) -> Routes {
        self.on(Verb::Get, path, handler)
    }

    pub(crate) fn post<H: Handler<T, Arc<Runtime>>, T: 'static>(self, path: &'static str, handler: H) -> Routes {
        self.on(Verb::Post, path, handler)
    }

    pub(crate) fn put<H: Handler<T, Arc<Runtime>>, T: 'static>(self, path: &'static str, handler: H) -> Routes {
        self.on(Verb::Put, path, handler)
    }

    pub(crate) fn delete<H: Handler<T, Arc<Runtime>>, T: 'static>(self, path: &'static str, handler: H) -> Routes {
        self.on(Verb::Delete, path, handler)
    }

    // A second method on a path merges into its route (axum does that for
    // `route` called twice with one path), so each method is its own call.
    fn on<H: Handler<T, Arc<Runtime>>, T: 'static>(mut self, verb: Verb, path: &'static str, handler: H) -> Routes {
        self.router = self.router.route(path, on(verb.filter(), handler));
        self.served.insert((path, verb));
        self
    }

    pub(crate) fn merge(mut self, other: Routes) -> Routes {
        self.router = self.router.merge(other.router);
        self.served.extend(other.served);
        self
    }

    /// Wraps the routes added so far, e.g. in a layer; `wrap` must add no
    /// routes (they would not be recorded).
    pub(crate) fn wrap(mut self, wrap: impl FnOnce(Router<Arc<Runtime>>) -> Router<Arc<Runtime>>) -> Routes {
        self.router = wrap(self.router);
        self
    }

    pub(crate) fn into_router(self) -> Router<Arc<Runtime>> {
        self.router
    }

    /// Every (path, method) served.
    #[cfg(test)]
    pub(crate) fn served(&self) -> &BTreeSet<(&'static str, Verb)> {
        &self.served
    }
}
