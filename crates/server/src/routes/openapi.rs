//! The OpenAPI 3.1 document of the API, generated: each handler's
//! `#[utoipa::path]` says its route, parameters, bodies and answers, and
//! the wire types of `cairn-api` give the schemas. Served at
//! `GET /v1/openapi.json` without the bearer token: it holds no secrets,
//! and tools fetch it before they hold one.

use std::sync::LazyLock;

use axum::Json;
use cairn_api::exec::{ClientFrame, ExecStart, ServerFrame};
use cairn_api::{ErrorBody, ErrorCode};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder, Schema};
use utoipa::{Modify, OpenApi};

use super::served::Routes;
use super::{admin, api_keys, deliver, outgoing_hooks, port_links, processes, secrets, egress, exec, files, gateway, images, mcp, nodes, snapshots, tasks, waits};

#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "Cairn",
        description = "The HTTP API of the Cairn daemon: long-running agent tasks in sandboxes, their snapshots, waits, egress and deliveries. Every route needs `Authorization: Bearer <token>` except the ones that say otherwise. Errors are `{\"error\": {\"code\", \"message\"}}` with a stable `code` (see `ErrorCode`).",
    ),
    paths(
        serve,
        admin::health, admin::metrics, admin::gc, admin::check, admin::backup,
        api_keys::list_api_keys, api_keys::create_api_key, api_keys::revoke_api_key,
        secrets::list_secrets, secrets::show_secret, secrets::set_secret, secrets::remove_secret,
        outgoing_hooks::list_hooks, outgoing_hooks::add_hook, outgoing_hooks::show_hook, outgoing_hooks::remove_hook, outgoing_hooks::hook_outbox, outgoing_hooks::test_hook,
        nodes::list,
        port_links::create_link,
        processes::start, processes::list, processes::show, processes::stdin, processes::resize, processes::kill,
        tasks::list, tasks::create, tasks::show, tasks::destroy, tasks::events, tasks::watch,
        exec::exec, exec::run,
        files::download, files::upload, files::read_one, files::write_one, files::list_dir,
        snapshots::list, snapshots::take, snapshots::diff, snapshots::rollback, snapshots::fork, snapshots::progress,
        waits::create, waits::cancel, waits::show, waits::approve, waits::inbox, waits::operator_event, waits::suspend, waits::resume,
        egress::show, egress::update,
        deliver::deliver, deliver::complete, deliver::deliverable, deliver::record, deliver::ledger, deliver::checkpoint, deliver::keys, deliver::rotate_key,
        images::list, images::import, images::pull, images::pull_progress, images::import_progress, images::commit, images::remove,
        images::show,
        gateway::hook, gateway::approval_page, gateway::approval_form,
        mcp::mcp,
    ),
    // The exec WebSocket's frames travel in no HTTP body; listed so that
    // clients find their schemas.
    components(schemas(ExecStart, ClientFrame, ServerFrame, ErrorBody, ErrorCode)),
    modifiers(&Security, &Errors, &OptionalBodies),
    security(("bearer" = [])),
    tags(
        (name = "daemon", description = "The daemon: health, metrics, this document, the blob store's gc and check"),
        (name = "nodes", description = "The daemons sharing the task database"),
        (name = "tasks", description = "Tasks and their event log"),
        (name = "exec", description = "Commands in a task"),
        (name = "files", description = "Files in and out of a task's sandbox"),
        (name = "snapshots", description = "Snapshots, rollback in place, forks"),
        (name = "waits", description = "Waits, the inbox, suspend and resume"),
        (name = "egress", description = "A task's egress allowlist and decision log"),
        (name = "secrets", description = "Credentials the egress proxy injects: set and listed, never answered"),
        (name = "hooks", description = "Outgoing notifications: the operator's endpoints, their outbox, a test send"),
        (name = "deliveries", description = "Deliverables, signed records, the ledger and the node's keys"),
        (name = "images", description = "Base images"),
        (name = "gateway", description = "Routes with their own authentication instead of the bearer token"),
    ),
)]
pub struct ApiDoc;

/// The document, built once.
static DOCUMENT: LazyLock<utoipa::openapi::OpenApi> = LazyLock::new(ApiDoc::openapi);

pub(super) fn routes() -> Routes {
    Routes::new().get("/v1/openapi.json", serve)
}

#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "openapi",
    tag = "daemon",
    security(()),
    responses((status = 200, description = "This document (OpenAPI 3.1); no bearer token needed", content_type = "application/json", body = Object))
)]
async fn serve() -> Json<&'static utoipa::openapi::OpenApi> {
    Json(&DOCUMENT)
}

/// The security schemes: the bearer token, and the two signatures of the
/// gateway's routes.
struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        let bearer = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some("The daemon's token, in `$CAIRN_HOME/token`"))
            .build();
        components.add_security_scheme("bearer", SecurityScheme::Http(bearer));
        components.add_security_scheme(
            "webhook_signature",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "webhook-signature",
                "Standard Webhooks: the HMAC-SHA256 of `webhook-id`, `webhook-timestamp` and the body, with the task's `webhook_secret`",
            ))),
        );
        components.add_security_scheme(
            "approval_link",
            SecurityScheme::ApiKey(ApiKey::Query(ApiKeyValue::with_description(
                "sig",
                "The signature of an approval link (with its `exp`), as the wait's `approval_url` carries it",
            ))),
        );
    }
}

/// The error answers: the codes (generated from [`ErrorCode::ALL`], so the
/// list stays whole) on the `ErrorCode` schema, and an `Error` response
/// every operation without its own `default` answers for other statuses.
struct Errors;

impl Modify for Errors {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let codes: Vec<String> = ErrorCode::ALL.iter().map(|c| format!("`{}` ({})", c.as_str(), c.status())).collect();
        let components = doc.components.get_or_insert_with(Default::default);
        if let Some(RefOr::T(Schema::Object(code))) = components.schemas.get_mut("ErrorCode") {
            code.description = Some(format!("The stable code of an error answer, with the HTTP status it comes with: {}.", codes.join(", ")));
        }
        let error = ResponseBuilder::new()
            .description("An error: `{\"error\": {\"code\", \"message\"}}`; the code is stable, for programs, the message one line for people")
            .content("application/json", ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build())
            .build();
        components.responses.insert("Error".to_owned(), RefOr::T(error));
        for item in doc.paths.paths.values_mut() {
            let operations = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete];
            for op in operations.into_iter().flatten() {
                if !op.responses.responses.contains_key("default") {
                    op.responses.responses.insert("default".to_owned(), RefOr::Ref(Ref::from_response_name("Error")));
                }
            }
        }
    }
}

/// A body that may be left out is written `Option<T>` in the annotations,
/// which utoipa turns into "`T` or `null`" (and not required). The daemon
/// reads an empty body as `{}` and never takes `null`: the schema is `T`'s.
struct OptionalBodies;

impl Modify for OptionalBodies {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        for item in doc.paths.paths.values_mut() {
            let operations = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete];
            for op in operations.into_iter().flatten() {
                let Some(body) = op.request_body.as_mut() else { continue };
                for content in body.content.values_mut() {
                    if let Some(RefOr::T(Schema::OneOf(one_of))) = &content.schema {
                        let named = one_of.items.iter().find(|s| matches!(s, RefOr::Ref(_))).cloned();
                        if one_of.items.len() == 2 && named.is_some() {
                            content.schema = named;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeSet;
    use std::sync::Arc;

    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    /// Every (path, method) the document has.
    fn documented(doc: &utoipa::openapi::OpenApi) -> BTreeSet<(String, &'static str)> {
        let mut set = BTreeSet::new();
        for (path, item) in doc.paths.paths.iter() {
            let operations = [
                ("get", &item.get),
                ("put", &item.put),
                ("post", &item.post),
                ("delete", &item.delete),
                ("options", &item.options),
                ("head", &item.head),
                ("patch", &item.patch),
                ("trace", &item.trace),
            ];
            for (method, op) in operations {
                if op.is_some() {
                    set.insert((path.clone(), method));
                }
            }
        }
        set
    }

    #[test]
    fn the_routes_served_and_the_routes_documented_are_the_same_set() {
        let served: BTreeSet<(String, &'static str)> =
            super::super::routes(Arc::new(String::new())).served().iter().map(|(path, verb)| ((*path).to_owned(), verb.as_str())).collect();
        let documented = documented(&ApiDoc::openapi());
        let undocumented: Vec<_> = served.difference(&documented).collect();
        let not_served: Vec<_> = documented.difference(&served).collect();
        assert!(undocumented.is_empty(), "served but not in the OpenAPI document: {undocumented:?}");
        assert!(not_served.is_empty(), "in the OpenAPI document but not served: {not_served:?}");
        assert!(served.len() > 40, "{served:?}");
    }

    #[test]
    fn the_document_lists_every_error_code_and_every_operation_answers_errors() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        assert_eq!(doc["openapi"].as_str().map(|v| v.starts_with("3.1.")), Some(true), "{}", doc["openapi"]);
        let code = &doc["components"]["schemas"]["ErrorCode"];
        let listed: Vec<&str> = code["enum"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
        let all: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(listed, all);
        let description = code["description"].as_str().unwrap();
        for c in ErrorCode::ALL {
            assert!(description.contains(&format!("`{}` ({})", c.as_str(), c.status())), "{c:?} in {description}");
        }
        assert_eq!(doc["components"]["schemas"]["ErrorBody"]["properties"]["error"]["$ref"], "#/components/schemas/ErrorDetail");
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                assert!(op["responses"]["default"].is_object(), "{method} {path} has no default (error) answer");
            }
        }
    }

    #[test]
    fn operation_ids_are_unique_and_optional_bodies_are_objects() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let mut ids = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let id = op["operationId"].as_str().unwrap_or_else(|| panic!("{method} {path} has no operationId"));
                assert!(ids.insert(id.to_owned()), "operationId {id} twice ({method} {path})");
            }
        }
        let gc = &doc["paths"]["/v1/gc"]["post"]["requestBody"];
        assert_eq!(gc["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/GcRequest");
        assert_ne!(gc["required"], true);
    }

    /// Every `$ref` names a component that is there.
    #[test]
    fn every_reference_resolves() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let mut refs = Vec::new();
        collect_refs(&doc, &mut refs);
        assert!(!refs.is_empty());
        for r in refs {
            let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("{r} is not local"));
            assert!(doc.pointer(pointer).is_some(), "{r} names nothing");
        }
    }

    fn collect_refs(v: &serde_json::Value, into: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(o) => {
                if let Some(serde_json::Value::String(r)) = o.get("$ref") {
                    into.push(r.clone());
                }
                o.values().for_each(|v| collect_refs(v, into));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| collect_refs(v, into)),
            _ => {}
        }
    }

    /// The real router, on a runtime over the fake sandbox driver: the
    /// document is served without the token; the API still needs it.
    #[tokio::test]
    async fn the_router_serves_the_document_without_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let home = cairn_runtime::Home::new(dir.path().join("home"));
        std::fs::create_dir_all(home.root()).unwrap();
        let fake = Arc::new(cairn_sandbox::fake::FakeDriver::new(&dir.path().join("sandboxes")).unwrap());
        let config = cairn_runtime::Config { disk_pool: 0, ..Default::default() };
        let rt = Arc::new(cairn_runtime::Runtime::with_driver(&home, &config, fake, "127.0.0.1:9".parse().unwrap()).await.unwrap());
        let app = super::super::router(rt.clone(), "secret".into());

        let answer = app.clone().oneshot(Request::get("/v1/openapi.json").body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(answer.headers()["content-type"], "application/json");
        let bytes = answer.into_body().collect().await.unwrap().to_bytes();
        let served: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(served, serde_json::to_value(ApiDoc::openapi()).unwrap());

        let refused = app.clone().oneshot(Request::get("/v1/tasks").body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        let health = Request::get("/v1/health").header("authorization", "Bearer secret").body(Body::empty()).unwrap();
        let health = app.oneshot(health).await.unwrap();
        assert_eq!(health.status(), StatusCode::OK);
        let bytes = health.into_body().collect().await.unwrap().to_bytes();
        let health: cairn_api::health::Health = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(health.home.as_deref(), Some(home.root().to_str().unwrap()));
        rt.shutdown().await;
    }
}
