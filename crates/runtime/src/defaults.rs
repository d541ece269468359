//! The lifecycle part's own state: what a new task gets where its create
//! request says nothing (limits, retention, idle suspend, isolation,
//! egress rules), from the daemon's config. Turning a request into a task
//! config is pure: checked here completely, before anything is written.

use std::time::Duration;

use cairn_api::tasks::CreateRequest;
use cairn_core::{EgressRules, EnvVar, Isolation, Limits, Retention, TaskConfig, check_name, check_workdir};

use crate::config::Config;
use crate::lifecycle::check_metadata;
use crate::runtime::parse_positive_ms;
use crate::Error;

#[derive(Debug)]
pub(crate) struct TaskDefaults {
    limits: Limits,
    retention: Retention,
    idle_suspend: Option<Duration>,
    isolation: Isolation,
    egress: EgressRules,
}

impl TaskDefaults {
    pub(crate) fn new(config: &Config) -> TaskDefaults {
        TaskDefaults {
            limits: config.defaults,
            retention: config.retention.clone(),
            idle_suspend: config.idle_suspend,
            isolation: config.isolation,
            egress: config.egress.default_rules.clone(),
        }
    }

    /// The config of a new task asked for by `req`, with the defaults
    /// where it says nothing, checked completely (all but whether this
    /// host runs its isolation, which is the driver's to say).
    pub(crate) fn config_from(&self, req: &CreateRequest) -> Result<TaskConfig, Error> {
        let mut limits = self.limits;
        if let Some(m) = &req.memory {
            limits.set_memory(m)?;
        }
        if let Some(c) = &req.cpus {
            limits.set_cpus(c)?;
        }
        if let Some(p) = &req.pids {
            limits.set_pids(p)?;
        }
        if let Some(d) = &req.disk {
            limits.set_disk(d)?;
        }
        let env = req.env.iter().map(|e| EnvVar::parse(e)).collect::<Result<Vec<_>, _>>()?;
        let workdir = req.workdir.clone().unwrap_or_else(|| cairn_core::DEFAULT_WORKDIR.to_owned());
        check_workdir(&workdir)?;
        if let Some(n) = &req.name {
            check_name(n)?;
        }
        let image = req.image.clone().unwrap_or_else(|| cairn_core::DEFAULT_IMAGE.to_owned());
        let mut retention = self.retention.clone();
        if let Some(k) = req.keep_last {
            retention.keep_last = k;
        }
        if let Some(m) = req.keep_milestones {
            retention.keep_milestones = m;
        }
        if let Some(e) = &req.expire_after {
            retention.expire_after = crate::config::parse_expiry(e).map_err(|e| Error::invalid(format!("--expire-after: {e}")))?;
        }
        cairn_core::RiskPolicy::new(req.risky.iter().map(String::as_str))?;
        let idle_suspend_ms = match &req.idle_suspend {
            Some(d) => Some(parse_positive_ms("--idle-suspend", d)?),
            None => self.idle_suspend.map(|d| d.as_millis() as u64),
        };
        if req.services.iter().any(|s| s.trim().is_empty() || s.contains('\0')) {
            return Err(Error::invalid("a --service must be a non-empty command"));
        }
        let egress = if req.allow.is_empty() && req.deny.is_empty() && req.rules.is_empty() && req.inject.is_empty() {
            self.egress.clone()
        } else {
            crate::config::egress_rules_with(&req.allow, &req.deny, &req.rules, &req.inject).map_err(|e| Error::invalid(e.to_string()))?
        };
        let isolation = match &req.isolation {
            Some(i) => i.parse::<cairn_core::Isolation>()?,
            None => self.isolation,
        };
        let keep_memory = req.keep_memory.unwrap_or(isolation.keeps_memory());
        if keep_memory && !isolation.keeps_memory() {
            return Err(Error::invalid(format!(
                "--keep-memory needs --isolation gvisor: the {isolation} driver cannot checkpoint processes"
            )));
        }
        check_metadata(&req.metadata)?;
        let deadline_ms = match &req.timeout {
            Some(t) => Some(cairn_store::now_ms().saturating_add(parse_positive_ms("timeout", t)? as i64)),
            None => None,
        };
        Ok(TaskConfig {
            image,
            limits,
            isolation,
            keep_memory,
            metadata: req.metadata.clone(),
            deadline_ms,
            suspend_at_deadline: req.suspend_at_timeout.unwrap_or(false),
            env,
            workdir,
            retention,
            risky: req.risky.clone(),
            services: req.services.clone(),
            idle_suspend_ms,
            egress,
            ..TaskConfig::default()
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn defaults() -> TaskDefaults {
        let mut config = Config { idle_suspend: Some(Duration::from_secs(60)), ..Config::default() };
        config.egress.default_rules.allow = vec!["docs.example.org".into()];
        TaskDefaults::new(&config)
    }

    #[test]
    fn a_request_that_says_nothing_gets_the_defaults() {
        let d = defaults();
        let c = d.config_from(&CreateRequest::default()).unwrap();
        assert_eq!((c.image.as_str(), c.workdir.as_str()), (cairn_core::DEFAULT_IMAGE, cairn_core::DEFAULT_WORKDIR));
        assert_eq!((c.limits.memory_bytes, c.limits.pids), (d.limits.memory_bytes, d.limits.pids));
        assert_eq!(c.idle_suspend_ms, Some(60_000));
        assert_eq!(c.isolation, d.isolation);
        assert_eq!(c.egress.allow, vec!["docs.example.org".to_owned()]);
        assert_eq!(c.retention.keep_last, d.retention.keep_last);
        assert_eq!(c.deadline_ms, None);
    }

    #[test]
    fn what_a_request_says_wins_over_the_defaults() {
        let req = CreateRequest {
            memory: Some("256M".into()),
            idle_suspend: Some("5s".into()),
            allow: vec!["api.example.com".into()],
            keep_last: Some(3),
            timeout: Some("1h".into()),
            ..CreateRequest::default()
        };
        let c = defaults().config_from(&req).unwrap();
        assert_eq!(c.limits.memory_bytes, 256 << 20);
        assert_eq!(c.idle_suspend_ms, Some(5_000));
        assert_eq!(c.egress.allow, vec!["api.example.com".to_owned()], "the task's rules replace the default ones");
        assert_eq!(c.retention.keep_last, 3);
        assert!(c.deadline_ms.is_some_and(|d| d > cairn_store::now_ms()));
    }

    #[test]
    fn a_bad_field_is_refused_by_name() {
        let cases: [(CreateRequest, &str); 4] = [
            (CreateRequest { memory: Some("lots".into()), ..CreateRequest::default() }, "memory"),
            (CreateRequest { idle_suspend: Some("0s".into()), ..CreateRequest::default() }, "--idle-suspend"),
            (CreateRequest { services: vec![" ".into()], ..CreateRequest::default() }, "--service"),
            (CreateRequest { keep_memory: Some(true), isolation: Some("native".into()), ..CreateRequest::default() }, "--keep-memory"),
        ];
        for (req, named) in cases {
            let e = defaults().config_from(&req).unwrap_err().to_string();
            assert!(e.contains(named), "{named}: {e}");
        }
    }
}
