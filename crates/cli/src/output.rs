//! Human output of the client subcommands.

use serde_json::Value;

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// Milliseconds since the epoch as RFC 3339 (UTC, seconds).
pub fn time(ms: &Value) -> String {
    ms.as_i64()
        .and_then(|ms| u64::try_from(ms).ok())
        .map(|ms| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)).to_string())
        .unwrap_or_else(|| "-".into())
}

fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| -> String {
        cells.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect::<Vec<_>>().join("  ").trim_end().to_owned()
    };
    let mut out = vec![line(headers.iter().map(|h| h.to_string()).collect())];
    out.extend(rows.into_iter().map(line));
    out.join("\n")
}

pub fn task_table(v: &Value) -> String {
    let rows = v
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| {
                    vec![s(&t["id"]), s(&t["name"]), s(&t["state"]), s(&t["sandbox"]), s(&t["config"]["image"]), s(&t["step"]), time(&t["created_ms"])]
                })
                .collect()
        })
        .unwrap_or_default();
    table(&["ID", "NAME", "STATE", "SANDBOX", "IMAGE", "STEP", "CREATED"], rows)
}

pub fn task_detail(t: &Value) -> String {
    let l = &t["limits"];
    let env: Vec<String> = t["config"]["env"]
        .as_array()
        .map(|a| a.iter().map(|e| format!("{}={}", s(&e["key"]), s(&e["value"]))).collect())
        .unwrap_or_default();
    let mut lines = vec![
        format!("id:            {}", s(&t["id"])),
        format!("name:          {}", s(&t["name"])),
        format!("state:         {}", s(&t["state"])),
        format!("sandbox:       {}{}", s(&t["sandbox"]), t["sandbox_note"].as_str().map(|n| format!(" ({n})")).unwrap_or_default()),
        format!("image:         {}", s(&t["config"]["image"])),
        format!("limits:        memory {}, cpus {}, pids {}, disk {}", s(&l["memory"]), s(&l["cpus"]), s(&l["pids"]), s(&l["disk"])),
        format!("workdir:       {}", s(&t["config"]["workdir"])),
        format!("env:           {}", if env.is_empty() { "-".into() } else { env.join(" ") }),
        format!("step:          {}", s(&t["step"])),
        format!("memory:        {}", t["memory"].as_str().filter(|m| !m.is_empty()).unwrap_or("-")),
        format!("created:       {}", time(&t["created_ms"])),
        format!("last activity: {}", time(&t["last_activity_ms"])),
    ];
    let r = &t["rollback_note"];
    if r.is_object() {
        lines.push(format!(
            "rollback:      to {} from {} (step {}) at {}: {}",
            s(&r["to"]),
            s(&r["from"]),
            s(&r["from_step"]),
            time(&r["time_ms"]),
            s(&r["reason"])
        ));
    }
    if let Some(n) = t["recovery_note"].as_str() {
        lines.push(format!("recovery:      {n}"));
    }
    if let Some(ms) = t["config"]["idle_suspend_ms"].as_u64() {
        lines.push(format!("idle suspend:  after {}", humantime::format_duration(std::time::Duration::from_secs(ms / 1000))));
    }
    let ret = &t["config"]["retention"];
    lines.push(format!(
        "retention:     keep last {}, {} milestones, others expire {}",
        s(&ret["keep_last"]),
        if ret["keep_milestones"].as_bool() == Some(true) { "keep" } else { "no special rule for" },
        ret["expire_after"].as_u64().map(|ms| format!("after {}", humantime::format_duration(std::time::Duration::from_secs(ms / 1000)))).unwrap_or("never".into())
    ));
    lines.push(format!("egress:        {}", policy_line(&t["config"]["egress"])));
    if let Some(p) = t["config"]["risky"].as_array().filter(|a| !a.is_empty()) {
        lines.push(format!("risky:         {}", p.iter().map(s).collect::<Vec<_>>().join(", ")));
    }
    if let Some(pid) = t["sandbox_pid"].as_i64() {
        lines.push(format!("sandbox init:  host pid {pid}, uids from {}", s(&t["sandbox_uid_base"])));
    }
    lines.join("\n")
}

pub fn event_table(v: &Value) -> String {
    let rows = v
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    let args = e["args"].to_string();
                    let args = if args.chars().count() > 80 { format!("{}…", args.chars().take(79).collect::<String>()) } else { args };
                    vec![s(&e["seq"]), time(&e["time_ms"]), s(&e["kind"]), s(&e["actor"]), s(&e["exit_code"]), e["duration_ms"].as_u64().map(|d| format!("{d}ms")).unwrap_or("-".into()), args]
                })
                .collect()
        })
        .unwrap_or_default();
    table(&["SEQ", "TIME", "KIND", "ACTOR", "EXIT", "TOOK", "ARGS"], rows)
}

pub fn image_table(v: &Value) -> String {
    let rows = v
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| vec![s(&i["name"]), s(&i["kind"]), s(&i["files"]), crate::progress::human(i["size_bytes"].as_f64().unwrap_or(0.0)), s(&i["source"])])
                .collect()
        })
        .unwrap_or_default();
    table(&["NAME", "KIND", "ENTRIES", "SIZE", "SOURCE"], rows)
}

pub fn snapshot_table(v: &Value) -> String {
    let rows = v
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    let note = s(&x["note"]);
                    let note = if note.chars().count() > 48 { format!("{}…", note.chars().take(47).collect::<String>()) } else { note };
                    vec![
                        s(&x["id"]),
                        s(&x["kind"]),
                        if x["healthy"].as_bool() == Some(true) { "healthy".into() } else { "unhealthy".into() },
                        s(&x["step"]),
                        s(&x["files"]),
                        crate::progress::human(x["bytes"].as_f64().unwrap_or(0.0)),
                        crate::progress::human(x["added_bytes"].as_f64().unwrap_or(0.0)),
                        format!("{:.1}ms", x["freeze_ms"].as_f64().unwrap_or(0.0)),
                        time(&x["created_ms"]),
                        note,
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    table(&["ID", "KIND", "HEALTH", "STEP", "FILES", "SIZE", "ADDED", "FROZEN", "TIME", "NOTE"], rows)
}

pub fn diff_lines(v: &Value) -> String {
    let mut out = Vec::new();
    for (key, mark) in [("added", "+"), ("changed", "~"), ("deleted", "-")] {
        for p in v[key].as_array().into_iter().flatten() {
            out.push(format!("{mark} {}", p.as_str().unwrap_or_default()));
        }
    }
    if out.is_empty() {
        "no differences".into()
    } else {
        out.join("\n")
    }
}

pub fn gc_summary(v: &Value) -> String {
    let r = &v["report"];
    let verb = if v["dry_run"].as_bool() == Some(true) { "would free" } else { "freed" };
    let mut lines: Vec<String> = v["expired_snapshots"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| format!("{} snapshot {} of {} ({})", if v["dry_run"].as_bool() == Some(true) { "would expire" } else { "expired" }, s(&x["id"]), s(&x["task"]), s(&x["kind"])))
        .collect();
    lines.push(format!(
        "{verb} {} ({} packs, {} manifests); kept {} young and {} partly used packs",
        crate::progress::human(r["bytes_freed"].as_f64().unwrap_or(0.0)),
        s(&r["packs_deleted"]),
        s(&r["manifests_deleted"]),
        s(&r["kept_young"]),
        s(&r["packs_partly_live"]),
    ));
    for o in v["orphan_deliverables"].as_array().into_iter().flatten() {
        lines.push(format!("{} deliverable {} (no record names it)", if v["dry_run"].as_bool() == Some(true) { "would delete" } else { "deleted" }, s(o)));
    }
    lines.join("\n")
}

pub fn check_summary(v: &Value) -> String {
    let mut lines: Vec<String> = v["problems"].as_array().into_iter().flatten().map(|p| format!("problem: {}", s(p))).collect();
    let read = v["bytes_read"].as_f64().filter(|b| *b > 0.0).map(|b| format!(", {} read and verified", crate::progress::human(b))).unwrap_or_default();
    lines.push(format!(
        "checked {} manifests, {} chunks, {} packs{read}: {}",
        s(&v["manifests"]),
        s(&v["chunks"]),
        s(&v["packs"]),
        if lines.is_empty() { "no problems" } else { "PROBLEMS FOUND" }
    ));
    lines.join("\n")
}

pub fn wait_summary(v: &Value) -> String {
    let mut lines = vec![format!(
        "wait {} ({}): {}; task {}",
        s(&v["id"]),
        s(&v["kind"]),
        s(&v["state"]),
        s(&v["task_state"])
    )];
    if let Some(u) = v["approval_url"].as_str() {
        lines.push(format!("approve or reject at: {u}"));
    }
    if let Some(u) = v["webhook_url"].as_str() {
        lines.push(format!("webhook URL: {u}"));
    }
    lines.join("\n")
}

/// `allow a, b; deny c`, or `offline` when nothing is allowed.
pub fn policy_line(p: &Value) -> String {
    let list = |v: &Value| v.as_array().map(|a| a.iter().map(s).collect::<Vec<_>>()).unwrap_or_default();
    let (allow, deny) = (list(&p["allow"]), list(&p["deny"]));
    let mut out = if allow.is_empty() { "offline (no allow rules)".to_owned() } else { format!("allow {}", allow.join(", ")) };
    if !deny.is_empty() {
        out.push_str(&format!("; deny {}", deny.join(", ")));
    }
    out
}

/// `cairn egress log`: the policy, then one line per attempt.
pub fn egress_log(v: &Value) -> String {
    let rows = v["decisions"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|d| {
                    let verdict = match (d["open"].as_bool(), d["allowed"].as_bool()) {
                        (Some(true), _) => "open",
                        (_, Some(true)) => "allow",
                        _ => "deny",
                    };
                    vec![
                        time(&d["time_ms"]),
                        s(&d["kind"]),
                        format!("{}:{}", s(&d["host"]), s(&d["port"])),
                        s(&d["address"]),
                        verdict.to_owned(),
                        s(&d["status"]),
                        format!("{}/{}", s(&d["bytes_up"]), s(&d["bytes_down"])),
                        d["duration_ms"].as_u64().map(|d| format!("{d}ms")).unwrap_or("-".into()),
                        s(&d["reason"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    format!(
        "policy: {}\n{}",
        policy_line(v),
        table(&["TIME", "KIND", "DESTINATION", "ADDRESS", "VERDICT", "STATUS", "UP/DOWN", "TOOK", "REASON"], rows)
    )
}
