//! Charts drawn as inline SVG (no script, no image files; presentation
//! attributes only, as the Content-Security-Policy allows no inline
//! style), and the few metrics they draw, read from the daemon's
//! OpenMetrics text.

use maud::{html, Markup};

/// A horizontal bar chart: one bar per `(label, value)`, scaled to the
/// largest; the value is written at the bar's end.
pub fn bars(title: &str, bars: &[(String, f64)], unit: &str) -> Markup {
    const ROW: f64 = 22.0;
    const LABEL: f64 = 130.0;
    const WIDTH: f64 = 520.0;
    let max = bars.iter().map(|(_, v)| *v).fold(0.0_f64, f64::max);
    let height = ROW * bars.len().max(1) as f64 + 8.0;
    let summary = bars.iter().map(|(l, v)| format!("{l}: {v}{unit}")).collect::<Vec<_>>().join(", ");
    html! {
        figure.chart {
            figcaption { (title) }
            svg xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (WIDTH) " " (height) } width=(WIDTH) height=(height) role="img" aria-label={ (title) ": " (summary) } {
                @if bars.is_empty() {
                    text x="0" y="16" fill="currentColor" { "nothing yet" }
                }
                @for (i, (label, value)) in bars.iter().enumerate() {
                    @let y = i as f64 * ROW + 4.0;
                    @let w = if max > 0.0 { (WIDTH - LABEL - 70.0) * value / max } else { 0.0 };
                    text x="0" y=(y + 14.0) fill="currentColor" font-size="12" { (label) }
                    rect x=(LABEL) y=(y) width=(format!("{w:.1}")) height=(ROW - 6.0) rx="3" fill="#1a5fb4" {}
                    text x=(format!("{:.1}", LABEL + w + 6.0)) y=(y + 14.0) fill="currentColor" font-size="12" { (fmt_value(*value)) (unit) }
                }
            }
        }
    }
}

fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 { format!("{v:.0}") } else { format!("{v:.2}") }
}

/// One sample of the OpenMetrics text: `name{label="value"} number`.
#[derive(Debug, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    pub label: Option<(&'a str, &'a str)>,
    pub value: f64,
}

/// The samples of `text` named `name` (comments and other names skipped;
/// a sample with more than one label gives its first).
pub fn samples<'a>(text: &'a str, name: &str) -> Vec<Sample<'a>> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (head, value) = l.rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            let (metric, label) = match head.split_once('{') {
                Some((m, rest)) => {
                    let inner = rest.strip_suffix('}')?;
                    let (k, v) = inner.split(',').next()?.split_once('=')?;
                    (m, Some((k, v.trim_matches('"'))))
                }
                None => (head, None),
            };
            (metric == name).then_some(Sample { name: metric, label, value })
        })
        .collect()
}

/// A cumulative histogram's buckets (`name_bucket{le=...}`) as counts per
/// bucket, labelled by their upper bound in milliseconds; empty buckets
/// at either end are left out.
pub fn histogram_ms(text: &str, name: &str) -> Vec<(String, f64)> {
    let buckets = samples(text, &format!("{name}_bucket"));
    let mut out = Vec::new();
    let mut below = 0.0;
    for b in &buckets {
        let Some(("le", le)) = b.label else { continue };
        let label = match le.parse::<f64>() {
            Ok(s) if s.is_finite() => format!("≤ {} ms", fmt_value(s * 1000.0)),
            _ => "more".to_owned(),
        };
        out.push((label, b.value - below));
        below = b.value;
    }
    let first = out.iter().position(|(_, n)| *n > 0.0).unwrap_or(out.len());
    let last = out.iter().rposition(|(_, n)| *n > 0.0).map_or(first, |i| i + 1);
    out.drain(first..last).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP cairn_tasks Tasks by state.\n\
        # TYPE cairn_tasks gauge\n\
        cairn_tasks{state=\"running\"} 3\n\
        cairn_tasks{state=\"suspended\"} 1\n\
        cairn_wake_duration_seconds_sum 0.5\n\
        cairn_wake_duration_seconds_bucket{le=\"0.001\"} 0\n\
        cairn_wake_duration_seconds_bucket{le=\"0.002\"} 0\n\
        cairn_wake_duration_seconds_bucket{le=\"0.004\"} 2\n\
        cairn_wake_duration_seconds_bucket{le=\"0.008\"} 5\n\
        cairn_wake_duration_seconds_bucket{le=\"0.016\"} 5\n\
        cairn_wake_duration_seconds_bucket{le=\"+Inf\"} 5\n\
        cairn_egress_decisions_total{verdict=\"allowed\"} 7\n";

    #[test]
    fn reads_samples_and_histograms() {
        let tasks = samples(TEXT, "cairn_tasks");
        assert_eq!(tasks.len(), 2);
        assert_eq!(tasks[0], Sample { name: "cairn_tasks", label: Some(("state", "running")), value: 3.0 });
        assert_eq!(samples(TEXT, "cairn_egress_decisions_total")[0].value, 7.0);
        assert!(samples(TEXT, "cairn_nothing").is_empty());
        let wake = histogram_ms(TEXT, "cairn_wake_duration_seconds");
        assert_eq!(wake, [("≤ 4 ms".to_owned(), 2.0), ("≤ 8 ms".to_owned(), 3.0)]);
        assert!(histogram_ms("", "cairn_wake_duration_seconds").is_empty());
    }

    #[test]
    fn charts_are_svg_with_escaped_labels() {
        let c = bars("Tasks <by> state", &[("<running>".into(), 3.0), ("done".into(), 1.5)], "").into_string();
        assert!(c.contains("<svg") && c.contains("role=\"img\""), "{c}");
        assert!(!c.contains("<running>") && c.contains("&lt;running&gt;"), "{c}");
        assert!(c.contains(">3<") && c.contains(">1.50<"), "{c}");
        assert!(!c.contains("style="), "no inline style: {c}");
        let empty = bars("Nothing", &[], "").into_string();
        assert!(empty.contains("nothing yet"));
    }
}
