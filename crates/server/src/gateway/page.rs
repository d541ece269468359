//! The approval page a person reaches from a signed link: server-rendered
//! HTML with inline CSS, no JavaScript and nothing fetched from elsewhere,
//! so it works in any browser and leaks the link to no third party.

use std::fmt::Write;

use cairn_api::waits::ApprovalContext;

/// HTML-escapes text for element content and quoted attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page for a pending approval: the task, what is asked, an optional
/// comment and the approve / reject form. `exp` and `sig` are echoed back in
/// hidden fields so the POST carries the same proof as the link.
pub fn render_pending(task: &str, wait_id: &str, prompt: &str, exp: i64, sig: &str, context: Option<&ApprovalContext>) -> String {
    let mut body = String::new();
    // Writing to a String cannot fail.
    let _ = write!(
        body,
        r#"<h1>Approval requested</h1>
<p class="lede">An agent task is waiting for your decision.</p>
<dl class="meta">
<dt>Task</dt><dd><code>{task}</code></dd>
<dt>Link valid until</dt><dd>{until}</dd>
</dl>
<section aria-labelledby="req">
<h2 id="req">Request</h2>
<div class="prompt">{prompt}</div>
</section>
{context}<form method="post" action="/approve/{wait}">
<input type="hidden" name="exp" value="{exp}">
<input type="hidden" name="sig" value="{sig}">
<label for="comment">Comment <span class="hint">(optional, passed on to the task)</span></label>
<textarea id="comment" name="comment" rows="3" maxlength="4000"></textarea>
<div class="actions">
<button type="submit" name="decision" value="approve" class="approve">Approve</button>
<button type="submit" name="decision" value="reject" class="reject">Reject</button>
</div>
</form>"#,
        task = escape(task),
        until = escape(&utc_minutes(exp)),
        prompt = escape(prompt),
        context = context.map(render_context).unwrap_or_default(),
        wait = escape(wait_id),
        exp = exp,
        sig = escape(sig),
    );
    layout("Approval requested", &body)
}

/// Paths listed per kind of change; the rest are counted.
const PATHS_SHOWN: usize = 20;

/// What an approver needs beside the prompt: the task's name and step,
/// the files changed since its last milestone, its last commands.
fn render_context(c: &ApprovalContext) -> String {
    let mut out = String::from("<dl class=\"meta\">");
    if let Some(name) = &c.task_name {
        let _ = write!(out, "<dt>Name</dt><dd>{}</dd>", escape(name));
    }
    let _ = writeln!(out, "<dt>Step</dt><dd>{}</dd></dl>", c.step);
    match &c.since_milestone {
        Some(m) => {
            let note = if m.note.is_empty() { String::new() } else { format!(" ({})", escape(&m.note)) };
            let _ = writeln!(out, "<h2>Changed since milestone <code>{}</code>{note}</h2>", escape(&m.milestone));
            let kinds = [("added", &m.diff.added), ("changed", &m.diff.changed), ("deleted", &m.diff.deleted)];
            if kinds.iter().all(|(_, l)| l.is_empty()) {
                out.push_str("<p class=\"lede\">Nothing.</p>\n");
            } else {
                out.push_str("<ul class=\"changes\">");
                for (label, list) in kinds.iter().filter(|(_, l)| !l.is_empty()) {
                    let shown: Vec<String> = list.iter().take(PATHS_SHOWN).map(|p| format!("<code>{}</code>", escape(p))).collect();
                    let more = if list.len() > PATHS_SHOWN { format!(" and {} more", list.len() - PATHS_SHOWN) } else { String::new() };
                    let _ = write!(out, "<li>{label} ({}): {}{more}</li>", list.len(), shown.join(", "));
                }
                out.push_str("</ul>\n");
            }
        }
        None => out.push_str("<h2>Changed since the last milestone</h2>\n<p class=\"lede\">No milestone snapshot yet.</p>\n"),
    }
    if !c.last_commands.is_empty() {
        out.push_str("<h2>Last commands</h2>\n<ul class=\"commands\">");
        for e in &c.last_commands {
            let argv: Vec<&str> = e.args.get("argv").and_then(|v| v.as_array()).map(|v| v.iter().filter_map(|a| a.as_str()).collect()).unwrap_or_default();
            let exit = e.exit_code.map(|c| format!(" <span class=\"exit\">exit {c}</span>")).unwrap_or_default();
            let _ = write!(out, "<li><code>$ {}</code>{exit}</li>", escape(&argv.join(" ")));
        }
        out.push_str("</ul>\n");
    }
    out
}

/// The confirmation after a decision. `decision` is the form's value,
/// `approve` or `reject`.
pub fn render_done(task: &str, decision: &str, comment: Option<&str>) -> String {
    let (title, class) = match decision {
        "approve" | "approved" => ("Approved", "ok"),
        "reject" | "rejected" => ("Rejected", "no"),
        _ => ("Decision recorded", "ok"),
    };
    let mut body = String::new();
    let _ = write!(
        body,
        r#"<h1 class="{class}">{title}</h1>
<p class="lede">Your decision was passed on to the task. You can close this page.</p>
<dl class="meta">
<dt>Task</dt><dd><code>{task}</code></dd>
<dt>Decision</dt><dd>{title}</dd>
</dl>"#,
        task = escape(task),
    );
    if let Some(c) = comment.filter(|c| !c.trim().is_empty()) {
        let _ = write!(body, "\n<h2>Comment</h2>\n<div class=\"prompt\">{}</div>", escape(c));
    }
    layout(title, &body)
}

/// A page for links that cannot be used: expired, forged, already decided.
pub fn render_error(status_text: &str, message: &str) -> String {
    let body = format!("<h1 class=\"no\">{}</h1>\n<p class=\"lede\">{}</p>", escape(status_text), escape(message));
    layout(status_text, &body)
}

const STYLE: &str = r#"
:root { color-scheme: light dark; --bg: #f4f5f7; --card: #fff; --fg: #1c1e21; --muted: #5b616b; --line: #d8dce2;
  --ok: #146c2e; --no: #b3261e; --focus: #1a5fb4; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #17181b; --card: #222429; --fg: #e8eaed; --muted: #a3a9b3; --line: #3a3d44;
    --ok: #5cc27a; --no: #f28b82; --focus: #8ab4f8; }
}
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
  font: 16px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 38rem; margin: 2rem auto; padding: 2rem 2.25rem; background: var(--card);
  border: 1px solid var(--line); border-radius: 12px; }
h1 { font-size: 1.5rem; margin: 0 0 .25rem; }
h2 { font-size: .8rem; text-transform: uppercase; letter-spacing: .06em; color: var(--muted); margin: 1.5rem 0 .5rem; }
h1.ok { color: var(--ok); } h1.no { color: var(--no); }
.lede { color: var(--muted); margin: 0 0 1.25rem; }
main > :last-child { margin-bottom: 0; }
.meta { display: grid; grid-template-columns: max-content 1fr; gap: .25rem 1rem; margin: 0; }
.meta dt { color: var(--muted); } .meta dd { margin: 0; overflow-wrap: anywhere; }
ul.changes, ul.commands { margin: 0; padding-left: 1.2rem; overflow-wrap: anywhere; }
.exit { color: var(--muted); font-size: .9em; }
code { font: .95em ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.prompt { white-space: pre-wrap; overflow-wrap: anywhere; padding: .85rem 1rem; border: 1px solid var(--line);
  border-left: 4px solid var(--focus); border-radius: 6px; background: var(--bg); }
form { margin-top: 1.5rem; }
label { display: block; font-weight: 600; margin-bottom: .35rem; }
.hint { font-weight: 400; color: var(--muted); }
textarea { display: block; width: 100%; font: inherit; color: inherit; background: var(--card); padding: .5rem .65rem;
  border: 1px solid var(--line); border-radius: 6px; resize: vertical; }
.actions { display: flex; gap: .75rem; margin-top: 1.25rem; }
button { font: inherit; font-weight: 600; padding: .6rem 1.4rem; border-radius: 6px; cursor: pointer; border: 2px solid; }
button.approve { background: var(--ok); border-color: var(--ok); color: #fff; }
button.reject { background: transparent; border-color: var(--no); color: var(--no); }
@media (prefers-color-scheme: dark) { button.approve { color: #10151a; } }
:focus-visible { outline: 3px solid var(--focus); outline-offset: 2px; }
@media (max-width: 40rem) { main { margin: 0; border-radius: 0; border-width: 0 0 1px; padding: 1.5rem 1.25rem; } }
"#;

fn layout(title: &str, body: &str) -> String {
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<meta name="robots" content="noindex, nofollow">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'">
<title>{title} · Cairn</title>
<style>{STYLE}</style>
</head>
<body>
<main>
{body}
</main>
</body>
</html>
"#,
        title = escape(title),
    )
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM UTC`, without a date library.
fn utc_minutes(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02} UTC", rem / 3600, rem % 3600 / 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(escape(r#"<script>alert("x")</script>"#), "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;");
        assert_eq!(escape("it's a & b"), "it&#39;s a &amp; b");
        assert_eq!(escape("plain ✓"), "plain ✓");
    }

    #[test]
    fn pending_escapes_everything_it_shows() {
        let html = render_pending("t<b>", "w\"1", "<script>alert('hi')</script>\nsecond line", 0, "s\"ig", None);
        assert!(!html.contains("<script>"), "{html}");
        assert!(!html.contains("<b>"));
        assert!(html.contains("&lt;script&gt;alert(&#39;hi&#39;)&lt;/script&gt;\nsecond line"));
        assert!(html.contains(r#"action="/approve/w&quot;1""#));
        assert!(html.contains(r#"name="sig" value="s&quot;ig""#));
    }

    #[test]
    fn pending_form() {
        let html = render_pending("tAbC123", "wXyZ789", "Deploy to production?", 1_750_000_000_000, "tok-_123", None);
        assert!(html.contains("<title>Approval requested · Cairn</title>"));
        assert!(html.contains("<h1>Approval requested</h1>"));
        assert!(html.contains("<code>tAbC123</code>"));
        assert!(html.contains("Deploy to production?"));
        assert_eq!(html.matches("<form ").count(), 1);
        assert!(html.contains(r#"<form method="post" action="/approve/wXyZ789">"#));
        assert!(html.contains(r#"<input type="hidden" name="exp" value="1750000000000">"#));
        assert!(html.contains(r#"<input type="hidden" name="sig" value="tok-_123">"#));
        assert!(html.contains(r#"<textarea id="comment" name="comment""#));
        assert!(html.contains(r#"<label for="comment">"#));
        assert!(html.contains(r#"type="submit" name="decision" value="approve""#));
        assert!(html.contains(r#"type="submit" name="decision" value="reject""#));
        assert!(html.contains("2025-06-15 15:06 UTC"), "expiry shown");
        assert!(!html.contains("<script"), "no JavaScript");
        assert!(!html.contains("http://") && !html.contains("https://"), "no external assets");
    }

    #[test]
    fn done_and_error_pages() {
        let ok = render_done("tA", "approve", Some("ship <it>"));
        assert!(ok.contains(">Approved</h1>") && ok.contains("ship &lt;it&gt;"));
        let no = render_done("tA", "reject", None);
        assert!(no.contains(">Rejected</h1>") && !no.contains("Comment"));
        assert!(!render_done("tA", "reject", Some("  ")).contains("Comment"));
        let err = render_error("Link expired", "Ask for a new <link>.");
        assert!(err.contains(">Link expired</h1>") && err.contains("Ask for a new &lt;link&gt;."));
        assert!(!err.contains("<form"));
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_minutes(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_minutes(951_782_400_000), "2000-02-29 00:00 UTC");
        assert_eq!(utc_minutes(1_614_265_330_000), "2021-02-25 15:02 UTC");
        assert_eq!(utc_minutes(-1), "1969-12-31 23:59 UTC");
    }
}
