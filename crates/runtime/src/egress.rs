//! Egress for live sandboxes: one [`TaskProxy`] per sandbox, serving the
//! listening socket its init bound on `127.0.0.1:3128` inside the sandbox's
//! network namespace; the task's policy, changeable while it runs; and the
//! decision log, every attempt an `egress` event in the task's log.

use std::net::SocketAddr;
use std::sync::Arc;

use cairn_core::{EgressRules, EventKind, NewEvent, TaskId};
use serde::Deserialize;
use cairn_egress::{Attempt, Policy, ProxyConfig, SystemResolver, TaskProxy};
use cairn_sandbox::InitProcess;
use cairn_store::SharedStore;
use serde_json::json;
use tokio::sync::{mpsc, watch};

use crate::config::EgressConfig;
use crate::Error;

/// Most decision-log entries written in one transaction.
const LOG_BATCH: usize = 256;
/// How long the log writer waits for more entries before it writes.
const LOG_GATHER: std::time::Duration = std::time::Duration::from_millis(10);

/// What every task's proxy shares: the proxy settings and the resolver.
/// Each live sandbox's own proxy is a [`Proxy`] in the task's cell.
pub struct Egress {
    config: Arc<ProxyConfig>,
    resolver: Arc<SystemResolver>,
    /// Trust roots for the upstreams of intercepted hosts; the error says
    /// why there are none.
    upstream_tls: Result<Arc<rustls::ClientConfig>, String>,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The egress proxy of one live sandbox.
pub(crate) struct Proxy {
    /// The sandbox it serves.
    pub(crate) init: InitProcess,
    policy: watch::Sender<Arc<Policy>>,
    /// The values of the secrets the rules name, for an intercepting proxy.
    secrets: Option<watch::Sender<Arc<cairn_egress::proxy::SecretValues>>>,
    proxy: TaskProxy,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").field("init", &self.init).finish_non_exhaustive()
    }
}

impl Proxy {
    /// Hands new rules to the proxy: tunnels they deny are cut.
    pub(crate) fn update(&self, rules: &EgressRules, secrets: Option<cairn_egress::proxy::SecretValues>) {
        if let (Some(tx), Some(values)) = (&self.secrets, secrets) {
            tx.send_replace(Arc::new(values));
        }
        self.policy.send_replace(Arc::new(policy_of(rules)));
    }

    /// Stops the proxy; its open connections are closed and logged.
    pub(crate) async fn stop(self) {
        self.proxy.shutdown().await;
    }
}

pub use cairn_api::egress::{Decision, EgressView, PolicyUpdate};

/// The rules after `update`, checked and normalised.
pub fn apply_update(update: &PolicyUpdate, current: &EgressRules) -> Result<EgressRules, Error> {
        let added = cairn_egress::Policy::parse(&update.allow, &update.deny).map_err(|e| Error::invalid(e.to_string()))?;
        let added = EgressRules {
            allow: added.allow.iter().map(ToString::to_string).collect(),
            deny: added.deny.iter().map(ToString::to_string).collect(),
            ..EgressRules::default()
        };
        let mut rules = if update.clear { EgressRules::default() } else { current.clone() };
        for r in added.allow {
            rules.deny.retain(|d| *d != r);
            if !rules.allow.contains(&r) {
                rules.allow.push(r);
            }
        }
        for r in added.deny {
            rules.allow.retain(|a| *a != r);
            if !rules.deny.contains(&r) {
                rules.deny.push(r);
            }
        }
        // Request rules and injections are added, then all are checked
        // together (each needs a host the allow rules cover).
        let (mut more_rules, mut more_inject) = (rules.rules.clone(), rules.inject.clone());
        more_rules.extend(update.rules.iter().cloned());
        more_inject.extend(update.inject.iter().cloned());
        let mut checked = crate::config::egress_rules_with(&rules.allow, &rules.deny, &more_rules, &more_inject).map_err(|e| Error::invalid(e.to_string()))?;
        let dedup = |v: Vec<String>| v.iter().enumerate().filter(|(i, x)| !v[..*i].contains(x)).map(|(_, x)| x.clone()).collect::<Vec<_>>();
        checked.rules = dedup(checked.rules);
        checked.inject = dedup(checked.inject);
        Ok(checked)
}

/// The policy the proxy enforces for stored rules (stored rules were
/// checked when they were set; one that no longer parses denies all).
pub fn policy_of(rules: &EgressRules) -> Policy {
    Policy::parse(&rules.allow, &rules.deny).and_then(|p| p.with_requests(&rules.rules, &rules.inject)).unwrap_or_else(|e| {
        tracing::error!("stored egress rules do not parse ({e}); denying everything");
        Policy::default()
    })
}

/// What a command in the sandbox needs to find the proxy: set when the task
/// may reach anything at all.
pub fn proxy_environment(rules: &EgressRules) -> Vec<(&'static str, String)> {
    if rules.allow.is_empty() {
        return Vec::new();
    }
    let url = format!("http://{}", cairn_sandbox::PROXY_ADDR);
    let bypass = "localhost,127.0.0.1".to_owned();
    vec![
        ("HTTP_PROXY", url.clone()),
        ("HTTPS_PROXY", url.clone()),
        ("http_proxy", url.clone()),
        ("https_proxy", url),
        ("NO_PROXY", bypass.clone()),
        ("no_proxy", bypass),
    ]
}

impl Egress {
    /// `own` is the daemon's API address: the proxy never connects there.
    pub fn new(config: &EgressConfig, own: SocketAddr) -> Egress {
        let proxy = ProxyConfig {
            allow_private: config.allow_private.clone(),
            own_addrs: vec![own],
            max_tunnels: config.max_connections,
            idle_timeout: config.idle_timeout,
            max_duration: config.max_duration,
            handshake_timeout: config.handshake_timeout,
            ..ProxyConfig::default()
        };
        let extra = config.upstream_ca.as_ref().map(|p| std::fs::read(p).map_err(|e| format!("egress.upstream_ca {}: {e}", p.display())));
        let upstream_tls = match extra.transpose() {
            Ok(pem) => cairn_egress::proxy::upstream_tls(pem.as_deref()).map(Arc::new).map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        Egress { config: Arc::new(proxy), resolver: Arc::new(SystemResolver::new(config.hosts.clone().into_iter().collect())), upstream_tls }
    }

    /// The upstream trust roots, if they could be loaded.
    pub(crate) fn upstream_tls(&self) -> Option<Arc<rustls::ClientConfig>> {
        match &self.upstream_tls {
            Ok(c) => Some(c.clone()),
            Err(e) => {
                tracing::error!("intercepted hosts cannot be reached: {e}");
                None
            }
        }
    }

    /// Starts serving the proxy port of a sandbox that just started (or
    /// survived a daemon restart). Its init hands over the listening socket.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn start_proxy(
        &self,
        store: &SharedStore,
        metrics: &Arc<crate::metrics::Metrics>,
        driver: &crate::driver::Driver,
        task: &TaskId,
        rules: &EgressRules,
        init: InitProcess,
        interception: Option<(cairn_egress::proxy::Interception, watch::Sender<Arc<cairn_egress::proxy::SecretValues>>)>,
    ) -> Option<Proxy> {
        let listener = match driver.proxy_listener(task.as_str()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(task = %task, "cannot serve the egress proxy: {e}");
                return None;
            }
        };
        let (policy, policy_rx) = watch::channel(Arc::new(policy_of(rules)));
        let (log_tx, log_rx) = mpsc::unbounded_channel();
        let resolver: Arc<dyn cairn_egress::Resolver> = self.resolver.clone();
        let (interception, secrets) = match interception {
            Some((i, tx)) => (Some(i), Some(tx)),
            None => (None, None),
        };
        let proxy = match TaskProxy::start(listener, policy_rx, self.config.clone(), resolver, log_tx, interception) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(task = %task, "cannot serve the egress proxy: {e}");
                return None;
            }
        };
        tokio::spawn(write_decisions(store.clone(), metrics.clone(), task.clone(), log_rx));
        Some(Proxy { init, policy, secrets, proxy })
    }
}

impl crate::runtime::Runtime {
    pub async fn egress_view(&self, id: &str) -> Result<EgressView, Error> {
        let task = self.find(id).await?;
        let decisions = self
            .store
            .events(&task.id)
            .await?
            .into_iter()
            .filter(|e| e.kind == EventKind::Egress)
            // Entries that are not attempts are left out.
            .filter(|e| Attempt::deserialize(&e.args).is_ok())
            .filter_map(|e| Some(Decision { seq: e.seq, time_ms: e.time_ms, attempt: e.args.as_object()?.clone() }))
            .collect();
        let e = task.config.egress;
        Ok(EgressView { task: task.id, allow: e.allow, deny: e.deny, rules: e.rules, inject: e.inject, decisions })
    }

    /// Changes a task's rules: stored with a `policy_update` event first,
    /// then handed to its running proxy, which cuts what they now deny.
    pub async fn update_egress(&self, id: &str, update: PolicyUpdate, actor: &str) -> Result<EgressView, Error> {
        let task = self.find(id).await?;
        let lock = self.lock_of(&task.id);
        let _guard = lock.lock().await;
        let mut task = self.find(task.id.as_str()).await?;
        if task.state.is_terminal() {
            return Err(Error::conflict(format!("task {} is {}; its egress policy cannot change", task.id, task.state)));
        }
        task.config.egress = apply_update(&update, &task.config.egress)?;
        self.check_rule_secrets(&task.config.egress).await?;
        self.ensure_task_ca(&task.id, &task.config.egress).await?;
        let event = NewEvent {
            task: task.id.clone(),
            kind: EventKind::PolicyUpdate,
            actor: actor.to_owned(),
            args: json!({ "request": update, "allow": task.config.egress.allow, "deny": task.config.egress.deny, "rules": task.config.egress.rules, "inject": task.config.egress.inject }),
            exit_code: None,
            duration_ms: None,
        };
        self.store.set_config(&task.id, &task.config, &event).await?;
        let values = if task.config.egress.intercepts() { Some(self.secret_values(&task.config.egress).await) } else { None };
        self.cells.of(&task.id).with_proxy(|p| p.update(&task.config.egress, values));
        drop(_guard);
        self.egress_view(task.id.as_str()).await
    }
}

/// Drains one proxy's attempts into the task's event log, in batches.
async fn write_decisions(store: SharedStore, metrics: Arc<crate::metrics::Metrics>, task: TaskId, mut rx: mpsc::UnboundedReceiver<Attempt>) {
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, LOG_BATCH).await > 0 {
        // A moment for more to come: under load (an intercepted host logs
        // every request) one transaction then carries many entries instead
        // of one each, which the store's worker thread pays per call.
        if batch.len() < LOG_BATCH {
            tokio::time::sleep(LOG_GATHER).await;
            while batch.len() < LOG_BATCH {
                match rx.try_recv() {
                    Ok(a) => batch.push(a),
                    Err(_) => break,
                }
            }
        }
        for a in &batch {
            metrics.egress_decision(a.allowed);
        }
        // Each request a secret went out in counts as one use of it: one
        // update per secret per batch.
        let now = cairn_store::now_ms();
        let mut uses: std::collections::BTreeMap<&str, i64> = Default::default();
        for name in batch.iter().flat_map(|a| &a.secrets) {
            *uses.entry(name.as_str()).or_default() += 1;
        }
        for (name, n) in uses {
            if let Err(e) = store.use_secret(name, n, now).await {
                tracing::warn!(task = %task, "cannot count the uses of secret {name}: {e}");
            }
        }
        let events: Vec<NewEvent> = batch.drain(..).map(|a| decision_event(&task, &a)).collect();
        if let Err(e) = store.append_events(&events).await {
            tracing::error!(task = %task, "cannot write {} egress decisions: {e}", events.len());
        }
    }
}

fn decision_event(task: &TaskId, a: &Attempt) -> NewEvent {
    NewEvent {
        task: task.clone(),
        kind: EventKind::Egress,
        actor: "egress".to_owned(),
        args: serde_json::to_value(a).unwrap_or_else(|e| json!({ "error": e.to_string() })),
        exit_code: Some(if a.allowed { 0 } else { 1 }),
        duration_ms: Some(a.duration_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], deny: &[&str]) -> EgressRules {
        EgressRules { allow: allow.iter().map(|s| s.to_string()).collect(), deny: deny.iter().map(|s| s.to_string()).collect(), ..EgressRules::default() }
    }

    #[test]
    fn update_moves_rules_between_lists_and_normalises() {
        let current = rules(&["a.example.com", "b.example.com"], &[]);
        let up = PolicyUpdate { allow: vec!["C.Example.com.".into()], deny: vec!["a.example.com".into()], ..Default::default() };
        let new = apply_update(&up, &current).unwrap();
        assert_eq!(new, rules(&["b.example.com", "c.example.com"], &["a.example.com"]));
        let back = apply_update(&PolicyUpdate { allow: vec!["a.example.com".into()], ..Default::default() }, &new).unwrap();
        assert_eq!(back.deny, Vec::<String>::new());
        let cleared = apply_update(&PolicyUpdate { clear: true, ..Default::default() }, &new).unwrap();
        assert_eq!(cleared, EgressRules::default());
    }

    #[test]
    fn update_refuses_invalid_patterns_and_names_them() {
        for bad in ["*", "*x.com", "a.*.com", "example.com:0", "example.com:99999", "*.10.0.0.1", "10.0.0.1:0"] {
            let err = apply_update(&PolicyUpdate { allow: vec![bad.into()], ..Default::default() }, &EgressRules::default()).unwrap_err();
            assert!(err.to_string().contains(bad), "{bad}: {err}");
        }
        assert!(apply_update(&PolicyUpdate { allow: vec!["*.example.com:8443".into()], ..Default::default() }, &EgressRules::default()).is_ok());
    }

    #[test]
    fn proxy_variables_only_with_an_allowlist() {
        assert!(proxy_environment(&EgressRules::default()).is_empty());
        assert!(proxy_environment(&rules(&[], &["x.com"])).is_empty());
        let env = proxy_environment(&rules(&["packages.example.com"], &[]));
        for (k, v) in [("HTTP_PROXY", "http://127.0.0.1:3128"), ("https_proxy", "http://127.0.0.1:3128"), ("NO_PROXY", "localhost,127.0.0.1")] {
            assert!(env.contains(&(k, v.to_owned())), "{k}={v} in {env:?}");
        }
    }
}
