//! A horizontal bar chart as a standalone SVG file (no dependencies).

/// `rows` are (label, value); a log scale keeps a 1000x spread readable.
pub fn bar_chart(title: &str, unit: &str, rows: &[(String, f64)], log: bool) -> String {
    let (label_w, bar_w, row_h, top) = (220.0, 520.0, 26.0, 44.0);
    let height = top + row_h * rows.len() as f64 + 20.0;
    // A log axis starts at the decade below the smallest bar, so 2x differences still show.
    let smallest = rows.iter().map(|(_, v)| *v).filter(|v| v.is_finite() && *v > 0.0).fold(f64::MAX, f64::min);
    let floor = if smallest < f64::MAX { 10f64.powf(smallest.log10().floor()) / 10.0 } else { 1.0 };
    let scale = |v: f64| if log { (v / floor).max(1.0).log10() } else { v.max(0.0) };
    let max = rows.iter().map(|(_, v)| scale(*v)).fold(f64::MIN_POSITIVE, f64::max);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"13\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"24\" font-size=\"16\" font-weight=\"bold\">{title}</text>\n\
         <text x=\"{w2}\" y=\"24\" text-anchor=\"end\" fill=\"#555\">{unit}{logn}</text>\n",
        w = label_w + bar_w + 110.0,
        w2 = label_w + bar_w + 100.0,
        title = escape(title),
        unit = escape(unit),
        logn = if log { " (log scale)" } else { "" },
    );
    for (i, (label, value)) in rows.iter().enumerate() {
        let y = top + row_h * i as f64;
        let len = if value.is_finite() { bar_w * scale(*value) / max } else { 0.0 };
        svg += &format!(
            "<text x=\"{lx}\" y=\"{ty}\" text-anchor=\"end\">{label}</text>\n\
             <rect x=\"{label_w}\" y=\"{y}\" width=\"{len:.1}\" height=\"{h}\" fill=\"#3b7dd8\"/>\n\
             <text x=\"{vx:.1}\" y=\"{ty}\">{value}</text>\n",
            lx = label_w - 8.0,
            ty = y + row_h * 0.65,
            label = escape(label),
            h = row_h - 6.0,
            vx = label_w + len + 6.0,
            value = human(*value),
        );
    }
    svg + "</svg>\n"
}

fn human(v: f64) -> String {
    match v {
        v if !v.is_finite() => "-".into(),
        v if v >= 1e6 => format!("{:.2}M", v / 1e6),
        v if v >= 1e3 => format!("{:.1}k", v / 1e3),
        v => format!("{v:.2}"),
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_bar_per_row_and_text_escaped() {
        let svg = bar_chart("a<b", "iops", &[("x".into(), 10.0), ("y&z".into(), 1000.0), ("n".into(), f64::NAN)], true);
        assert_eq!(svg.matches("<rect x=").count(), 3);
        assert!(svg.contains("a&lt;b") && svg.contains("y&amp;z"));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    }
}
