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
