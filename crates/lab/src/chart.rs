//! Every lab's `--svg`: grouped horizontal bars, one colour per series (a path, a mode,
//! a VMM) with a legend, one panel per unit. Drawn with plotters' SVG backend.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One series: a name for the legend and a value per group (NaN: no bar).
pub struct Series {
    pub name: String,
    pub values: Vec<f64>,
}

/// One panel: its groups (row labels) and series share one axis.
pub struct Panel {
    pub title: String,
    pub unit: String,
    pub groups: Vec<String>,
    pub series: Vec<Series>,
    /// A log axis keeps a 1000x spread readable.
    pub log: bool,
}

impl Panel {
    /// A panel from (group, series, value) triples, groups and series in first-seen order;
    /// a pair never given has no bar.
    pub fn grouped(
        title: &str,
        unit: &str,
        log: bool,
        triples: impl IntoIterator<Item = (String, String, f64)>,
    ) -> Panel {
        let mut groups: Vec<String> = Vec::new();
        let mut series: Vec<Series> = Vec::new();
        for (group, name, value) in triples {
            let gi = groups.iter().position(|g| *g == group).unwrap_or_else(|| {
                groups.push(group);
                groups.len() - 1
            });
            let si = series.iter().position(|s| s.name == name).unwrap_or_else(|| {
                series.push(Series { name, values: Vec::new() });
                series.len() - 1
            });
            for s in &mut series {
                s.values.resize(groups.len(), f64::NAN);
            }
            series[si].values[gi] = value;
        }
        Panel { title: title.into(), unit: unit.into(), groups, series, log }
    }
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(0x3b, 0x7d, 0xd8),
    RGBColor(0xe8, 0x6a, 0x1c),
    RGBColor(0x2c, 0xa0, 0x5a),
    RGBColor(0x9b, 0x59, 0xb6),
    RGBColor(0xc0, 0x39, 0x2b),
    RGBColor(0x7f, 0x8c, 0x8d),
];
const WIDTH: u32 = 900;
const BAR: u32 = 16;
/// Roughly a 13-px sans-serif character: enough room that no label is cut off.
const CHAR: u32 = 7;
/// The legend's strip above each panel's plot, where it can cover no bar.
const LEGEND: u32 = 24;

fn panel_height(p: &Panel) -> u32 {
    let bars = (p.groups.len() * p.series.len().max(1)) as u32;
    LEGEND + 70 + bars * BAR + p.groups.len() as u32 * 10
}

/// The panels stacked in one SVG document.
pub fn draw(panels: &[Panel]) -> String {
    let height = panels.iter().map(panel_height).sum::<u32>().max(1);
    let label_w =
        panels.iter().flat_map(|p| &p.groups).map(|g| g.chars().count() as u32).max().unwrap_or(0) * CHAR + 20;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        let _ = root.fill(&WHITE);
        let mut rest = root;
        for panel in panels {
            let (area, below) = rest.split_vertically(panel_height(panel));
            let _ = draw_panel(&area, panel, label_w);
            rest = below;
        }
        let _ = rest.present();
    }
    svg
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    p: &Panel,
    label_w: u32,
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let scale = |v: f64| if p.log { v.max(1e-12).log10() } else { v };
    let finite: Vec<f64> =
        p.series.iter().flat_map(|s| &s.values).copied().filter(|v| v.is_finite() && *v > 0.0).collect();
    let (lo, hi) = if p.log {
        let min = finite.iter().copied().fold(f64::MAX, f64::min);
        let max = finite.iter().copied().fold(f64::MIN, f64::max);
        if finite.is_empty() {
            (0.0, 1.0)
        } else {
            (scale(min).floor() - 0.3, scale(max) + 0.35)
        }
    } else {
        (0.0, finite.iter().copied().fold(0.0, f64::max).max(1e-9) * 1.18)
    };
    let n = p.series.len().max(1) as f64;
    let groups = p.groups.len() as f64;
    let caption =
        if p.log { format!("{}, {} (log scale)", p.title, p.unit) } else { format!("{}, {}", p.title, p.unit) };
    let (legend, area) = area.split_vertically(LEGEND);
    draw_legend(&legend, p, label_w).map_err(err)?;
    let mut chart = ChartBuilder::on(&area)
        .caption(caption, ("sans-serif", 16))
        .margin(8)
        .margin_right(40)
        .x_label_area_size(24)
        .y_label_area_size(label_w)
        .build_cartesian_2d(lo..hi, 0.0..groups)
        .map_err(err)?;
    let labels = p.groups.clone();
    let log = p.log;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .light_line_style(WHITE)
        .y_labels(p.groups.len() * 2 + 1)
        .y_label_formatter(&move |y: &f64| {
            // Labels sit at each group's middle; other ticks stay blank.
            let i = (groups - y - 0.5).round();
            if (groups - y - 0.5 - i).abs() < 0.01 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        // A log axis is labelled at its decades only.
        .x_labels(if log { ((hi - lo).ceil() as usize).max(1) * 4 } else { 10 })
        .x_label_formatter(&move |x: &f64| match log {
            true if (x - x.round()).abs() < 1e-6 => human(10f64.powf(x.round())),
            true => String::new(),
            false => human(*x),
        })
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    for (si, series) in p.series.iter().enumerate() {
        let color = PALETTE[si % PALETTE.len()];
        let bars = series.values.iter().enumerate().filter(|(_, v)| v.is_finite()).map(|(gi, &v)| {
            // Group gi's top is at `groups - gi`; its series share 80% of the row.
            let top = groups - gi as f64 - 0.1 - 0.8 * si as f64 / n;
            let bottom = top - 0.8 / n;
            Rectangle::new([(lo, bottom), (scale(v).max(lo), top)], color.filled())
        });
        chart.draw_series(bars).map_err(err)?;
        let values = series.values.iter().enumerate().filter(|(_, v)| v.is_finite()).map(|(gi, &v)| {
            let middle = groups - gi as f64 - 0.1 - 0.8 * (si as f64 + 0.5) / n;
            Text::new(
                format!(" {}", human(v)),
                (scale(v).max(lo), middle),
                TextStyle::from(("sans-serif", 11).into_font()).pos(Pos::new(HPos::Left, VPos::Center)),
            )
        });
        chart.draw_series(values).map_err(err)?;
    }
    Ok(())
}

/// One swatch and name per series, left to right, above the plot.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    p: &Panel,
    label_w: u32,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let mut x = label_w as i32 + 8;
    for (si, series) in p.series.iter().enumerate() {
        let color = PALETTE[si % PALETTE.len()];
        area.draw(&Rectangle::new([(x, 8), (x + 12, 18)], color.filled()))?;
        area.draw(&Text::new(series.name.clone(), (x + 16, 7), ("sans-serif", 13)))?;
        x += 16 + series.name.chars().count() as i32 * CHAR as i32 + 24;
    }
    Ok(())
}

pub fn human(v: f64) -> String {
    match v {
        v if !v.is_finite() => "-".into(),
        v if v.abs() >= 1e9 => format!("{:.2}G", v / 1e9),
        v if v.abs() >= 1e6 => format!("{:.2}M", v / 1e6),
        v if v.abs() >= 1e4 => format!("{:.0}k", v / 1e3),
        v if v.abs() >= 1e3 => format!("{:.1}k", v / 1e3),
        v if v.abs() >= 10.0 || v.fract() == 0.0 => format!("{v:.0}"),
        v => format!("{v:.2}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_bar_per_value_a_legend_per_series_and_labels_kept() {
        let panel = Panel {
            title: "start".into(),
            unit: "ms".into(),
            groups: vec!["a long row label that must fit".into(), "b<&".into()],
            series: vec![
                Series { name: "exitless".into(), values: vec![10.0, 20.0] },
                Series { name: "firecracker".into(), values: vec![12.0, f64::NAN] },
            ],
            log: false,
        };
        let svg = draw(&[panel]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("exitless") && svg.contains("firecracker"), "legend");
        assert!(svg.contains("a long row label that must fit"));
        assert!(svg.contains("b&lt;&amp;"), "escaped");
        // Three bars in two colours, plus a legend swatch each.
        assert_eq!(svg.matches("fill=\"#3B7DD8\"").count(), 2 + 1, "{svg}");
        assert_eq!(svg.matches("fill=\"#E86A1C\"").count(), 1 + 1);
    }

    #[test]
    fn triples_become_groups_and_series() {
        let t = |g: &str, s: &str, v| (g.to_string(), s.to_string(), v);
        let p = Panel::grouped(
            "t",
            "u",
            false,
            [t("4K", "copy", 1.0), t("4K", "zerocopy", 2.0), t("64K", "zerocopy", 3.0)],
        );
        assert_eq!(p.groups, ["4K", "64K"]);
        assert_eq!(p.series.len(), 2);
        assert_eq!(p.series[0].values[0], 1.0);
        assert!(p.series[0].values[1].is_nan());
        assert_eq!(p.series[1].values, [2.0, 3.0]);
    }

    #[test]
    fn log_panels_and_empty_ones_draw() {
        let t = |g: &str, v| (g.to_string(), "s".to_string(), v);
        let p = Panel::grouped("x", "ops/s", true, [t("a", 10.0), t("b", 1e6)]);
        assert!(draw(&[p]).contains("ops/s (log scale)"));
        let empty = Panel::grouped("y", "u", false, []);
        assert!(draw(&[empty]).starts_with("<svg"));
    }
}
