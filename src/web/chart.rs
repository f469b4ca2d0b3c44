//! Charts drawn on the server as SVG: no script, nothing to load. Every value in the markup
//! is a number or fixed text (bar titles are formatted from numbers and times), so nothing
//! from outside reaches it.

use std::fmt::Write;

use crate::service::audit_access::Point;

const W: f64 = 720.0;
const H: f64 = 160.0;
// Room for the axis labels: "1000 ms" at the left, the top label's upper half, the last
// time label at the right.
const PAD_L: f64 = 56.0;
const PAD_T: f64 = 8.0;
const PAD_R: f64 = 8.0;
const PAD_B: f64 = 18.0;

/// The plot's width, between the labels.
const PLOT_W: f64 = W - PAD_L - PAD_R;

/// The y coordinate of `v` on a scale from 0 to `top`.
fn scale(v: f64, top: f64) -> f64 {
    PAD_T + (H - PAD_B - PAD_T) * (1.0 - v / top)
}

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if v <= m * mag {
            return m * mag;
        }
    }
    10.0 * mag
}

/// Stacked bars per interval: calls that succeeded, failed and were refused.
pub fn calls(points: &[Point], label: &str) -> String {
    let max = points
        .iter()
        .map(|p| (p.ok + p.errors + p.denials) as f64)
        .fold(0.0, f64::max);
    let top = nice_max(max);
    let n = points.len().max(1) as f64;
    let bw = PLOT_W / n;
    let y = |v: f64| scale(v, top);
    let mut s = String::new();
    let total: i64 = points.iter().map(|p| p.ok + p.errors + p.denials).sum();
    let _ = write!(
        s,
        r#"<svg class="chart" data-chart="calls" data-total="{total}" viewBox="0 0 {W} {H}" role="img" aria-label="{label}"><title>{label}</title>"#
    );
    axes(&mut s, top, "");
    for (i, p) in points.iter().enumerate() {
        let x = PAD_L + i as f64 * bw;
        let mut base = 0.0;
        for (v, class) in [
            (p.ok, "bar-ok"),
            (p.errors, "bar-error"),
            (p.denials, "bar-denied"),
        ] {
            if v > 0 {
                let h = y(base) - y(base + v as f64);
                let _ = write!(
                    s,
                    r#"<rect class="{class}" x="{x:.1}" y="{:.1}" width="{:.1}" height="{h:.1}"><title>{}: {} ok, {} failed, {} refused</title></rect>"#,
                    y(base + v as f64),
                    (bw - 1.0).max(0.5),
                    p.start.format("%Y-%m-%d %H:%M UTC"),
                    p.ok,
                    p.errors,
                    p.denials
                );
                base += v as f64;
            }
        }
    }
    time_labels(&mut s, points, bw);
    s.push_str("</svg>");
    s
}

/// p50 and p95 latency lines (ms), from the rollups' histograms.
pub fn latency(points: &[Point], label: &str) -> String {
    let max = points.iter().filter_map(|p| p.p95_ms).fold(0, i64::max) as f64;
    let top = nice_max(max);
    let n = points.len().max(1) as f64;
    let bw = PLOT_W / n;
    let y = |v: f64| scale(v, top);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="chart" data-chart="latency" viewBox="0 0 {W} {H}" role="img" aria-label="{label}"><title>{label}</title>"#
    );
    axes(&mut s, top, " ms");
    for (class, pick) in [
        (
            "line-p50",
            (|p: &Point| p.p50_ms) as fn(&Point) -> Option<i64>,
        ),
        ("line-p95", |p: &Point| p.p95_ms),
    ] {
        let pts: Vec<String> = points
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                pick(p).map(|v| format!("{:.1},{:.1}", PAD_L + (i as f64 + 0.5) * bw, y(v as f64)))
            })
            .collect();
        if !pts.is_empty() {
            let _ = write!(
                s,
                r#"<polyline class="{class}" fill="none" points="{}"/>"#,
                pts.join(" ")
            );
            // A line needs two points: a dot on each keeps a lone minute visible.
            for p in &pts {
                let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
                let dot = class.replace("line", "dot");
                let _ = write!(s, r#"<circle class="{dot}" cx="{x}" cy="{y}" r="2.5"/>"#);
            }
        }
    }
    time_labels(&mut s, points, bw);
    s.push_str("</svg>");
    s
}

fn axes(s: &mut String, top: f64, unit: &str) {
    for frac in [0.0, 0.5, 1.0] {
        let yv = scale(top * frac, top);
        let _ = write!(
            s,
            r#"<line class="grid" x1="{PAD_L}" x2="{}" y1="{yv:.1}" y2="{yv:.1}"/><text class="axis" x="{:.1}" y="{:.1}" text-anchor="end">{}{unit}</text>"#,
            W - PAD_R,
            PAD_L - 4.0,
            yv + 4.0,
            (top * frac).round() as i64
        );
    }
}

fn time_labels(s: &mut String, points: &[Point], bw: f64) {
    let n = points.len();
    // The first label starts at its bar and the last ends at its own, so neither is cut.
    for (i, anchor) in [
        (0, "start"),
        (n / 2, "middle"),
        (n.saturating_sub(1), "end"),
    ] {
        if let Some(p) = points.get(i) {
            let x = match anchor {
                "start" => PAD_L + i as f64 * bw,
                "end" => PAD_L + (i as f64 + 1.0) * bw,
                _ => PAD_L + (i as f64 + 0.5) * bw,
            };
            let _ = write!(
                s,
                r#"<text class="axis" x="{x:.1}" y="{:.1}" text-anchor="{anchor}">{}</text>"#,
                H - 4.0,
                p.start.format("%m-%d %H:%M")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(n: usize, p95: Option<i64>) -> Vec<Point> {
        let start = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        (0..n)
            .map(|i| Point {
                start: start + chrono::Duration::minutes(i as i64),
                ok: 30,
                errors: 5,
                denials: 15,
                p50_ms: p95.map(|v| v / 2),
                p95_ms: p95,
            })
            .collect()
    }

    /// Every label's anchor point lies inside the drawing, with room for its text: the
    /// first time label starts, the last ends, at the plot's edges; the top value's label
    /// sits below the top edge.
    #[test]
    fn labels_stay_inside_the_drawing() {
        for svg in [
            calls(&points(60, Some(900)), "c"),
            latency(&points(60, Some(900)), "l"),
        ] {
            let mut anchors = Vec::new();
            for text in svg.split("<text ").skip(1) {
                let attr = |name: &str| -> f64 {
                    let from = text.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
                    text[from..].split('"').next().unwrap().parse().unwrap()
                };
                let (x, y) = (attr("x"), attr("y"));
                assert!((0.0..=W).contains(&x) && (10.0..=H).contains(&y), "{text}");
                anchors.push((
                    x,
                    text.contains("text-anchor=\"start\""),
                    text.contains("text-anchor=\"end\""),
                ));
            }
            let times: Vec<_> = anchors.iter().filter(|a| a.0 > PAD_L - 1.0).collect();
            assert!(times.iter().any(|a| a.1 && a.0 >= PAD_L), "{svg}");
            assert!(times.iter().any(|a| a.2 && a.0 <= W - PAD_R + 0.1), "{svg}");
        }
    }

    #[test]
    fn a_lone_minute_of_latency_is_drawn() {
        let svg = latency(&points(1, Some(120)), "l");
        assert!(
            svg.contains(r#"class="dot-p95""#) && svg.contains(r#"class="dot-p50""#),
            "{svg}"
        );
        assert!(!latency(&points(3, None), "l").contains("<circle"));
    }
}
