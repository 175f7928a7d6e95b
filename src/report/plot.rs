//! SVG charts of a run's rounds against N: time per training and aggregate samples/s, one line per split mode.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{split_rank, RunRow};
use crate::error::ReportError;

type DrawResult<T> = Result<T, DrawingAreaErrorKind<std::io::Error>>;
type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

const PLOT_SIZE: (u32, u32) = (820, 560);
const FONT: &str = "sans-serif";
const LEGEND_FONT: u32 = 18;

/// Colour-blind-safe colours (Okabe and Ito), one per series in order.
const COLORS: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
];

/// What a chart shows on its y axis.
struct Metric {
    y_desc: &'static str,
    value: fn(&RunRow) -> f64,
}

const TIME_PER_TRAINING: Metric = Metric {
    y_desc: "time per training (s) = makespan / N",
    value: |r| r.time_per_training_s,
};

const SAMPLES_PER_S: Metric = Metric {
    y_desc: "training samples/s, all N trainings together",
    value: |r| r.samples_per_s,
};

/// Draws time per training against N, one line per split mode, as an SVG at `path`.
pub fn plot_time_per_training(
    runs: &[RunRow],
    path: &Path,
    title: &str,
) -> Result<(), ReportError> {
    plot(runs, path, title, &TIME_PER_TRAINING)
}

/// Draws aggregate training samples/s against N, one line per split mode, as an SVG at `path`.
pub fn plot_samples_per_s(runs: &[RunRow], path: &Path, title: &str) -> Result<(), ReportError> {
    plot(runs, path, title, &SAMPLES_PER_S)
}

/// Whether `plot_time_per_training` has a point to draw: some round completed a trial.
pub fn time_per_training_plottable(runs: &[RunRow]) -> bool {
    !collect_series(runs, &TIME_PER_TRAINING).is_empty()
}

/// Whether `plot_samples_per_s` has a point to draw.
pub fn samples_per_s_plottable(runs: &[RunRow]) -> bool {
    !collect_series(runs, &SAMPLES_PER_S).is_empty()
}

/// One line of a chart: its legend name, every round's point, and the mean at each N.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
    line: Vec<(f64, f64)>,
}

/// Which of the fields that name a series differ between rows.
struct Varying {
    model: bool,
    dataset: bool,
    device: bool,
}

impl Varying {
    fn of(runs: &[RunRow]) -> Self {
        let differs = |f: fn(&RunRow) -> &str| distinct(runs, f).len() > 1;
        Varying {
            model: differs(|r| &r.model),
            dataset: differs(|r| &r.dataset),
            device: differs(|r| &r.device),
        }
    }

    /// What the legend's names are made of.
    fn legend_title(&self) -> String {
        let parts = [
            (self.model, "model"),
            (self.dataset, "dataset"),
            (self.device, "device"),
        ];
        let prefix: Vec<&str> = parts.iter().filter(|p| p.0).map(|p| p.1).collect();
        series_name(&prefix, "split mode")
    }

    /// The series a row belongs to: its split, prefixed by what varies; also its sort key.
    fn key(&self, row: &RunRow) -> (Vec<String>, (usize, String)) {
        let mut prefix = Vec::new();
        let fields = [
            (self.model, &row.model),
            (self.dataset, &row.dataset),
            (self.device, &row.device),
        ];
        for (varies, field) in fields {
            if varies {
                prefix.push(field.clone());
            }
        }
        let (rank, split) = split_rank(&row.split);
        (prefix, (rank, split.to_string()))
    }
}

fn distinct(runs: &[RunRow], field: fn(&RunRow) -> &str) -> BTreeSet<&str> {
    runs.iter().map(field).collect()
}

fn series_name<S: AsRef<str>>(prefix: &[S], split: &str) -> String {
    if prefix.is_empty() {
        split.to_string()
    } else {
        let parts: Vec<&str> = prefix.iter().map(AsRef::as_ref).collect();
        format!("{}: {split}", parts.join(", "))
    }
}

/// The series to draw: rounds with a completed trial and a finite value, grouped and ordered.
fn collect_series(runs: &[RunRow], metric: &Metric) -> Vec<Series> {
    let varying = Varying::of(runs);
    let mut groups: BTreeMap<_, BTreeMap<u32, Vec<f64>>> = BTreeMap::new();
    for row in runs.iter().filter(|r| r.ok > 0 && r.n > 0) {
        let y = (metric.value)(row);
        if y.is_finite() {
            let by_n = groups.entry(varying.key(row)).or_default();
            by_n.entry(row.n).or_default().push(y);
        }
    }
    groups
        .into_iter()
        .map(|((prefix, (_, split)), by_n)| Series {
            name: series_name(&prefix, &split),
            points: by_n
                .iter()
                .flat_map(|(n, ys)| ys.iter().map(move |y| (f64::from(*n), *y)))
                .collect(),
            line: by_n
                .iter()
                .map(|(n, ys)| (f64::from(*n), ys.iter().sum::<f64>() / ys.len() as f64))
                .collect(),
        })
        .collect()
}

/// The line under the title: the device, and the backend and epochs when all rows share them.
fn subtitle(runs: &[RunRow]) -> String {
    let devices = distinct(runs, |r| &r.device);
    let mut parts = vec![if devices.len() == 1 {
        format!("device: {}", devices.iter().copied().collect::<String>())
    } else {
        format!(
            "devices: {}",
            devices.into_iter().collect::<Vec<_>>().join("; ")
        )
    }];
    let backends = distinct(runs, |r| &r.backend);
    if backends.len() == 1 {
        parts.push(format!(
            "backend: {}",
            backends.into_iter().collect::<String>()
        ));
    }
    let epochs: BTreeSet<u32> = runs.iter().map(|r| r.epochs).collect();
    if let (1, Some(e)) = (epochs.len(), epochs.first()) {
        parts.push(format!("{e} epoch(s) per training"));
    }
    parts.join("  ·  ")
}

fn plot(runs: &[RunRow], path: &Path, title: &str, metric: &Metric) -> Result<(), ReportError> {
    if runs.is_empty() {
        return Err(ReportError::Invalid(format!(
            "{}: no rounds to plot",
            path.display()
        )));
    }
    let series = collect_series(runs, metric);
    if series.is_empty() {
        return Err(ReportError::Invalid(format!(
            "{}: no round with a completed trial and a finite value to plot",
            path.display()
        )));
    }
    let chart = Chart {
        title,
        subtitle: subtitle(runs),
        metric,
        series: &series,
        legend_title: Varying::of(runs).legend_title(),
    };
    let svg = chart.draw().map_err(|e| ReportError::Plot {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    crate::outdir::replace_bytes(path, svg.as_bytes())
}

/// Everything one SVG shows.
struct Chart<'a> {
    title: &'a str,
    subtitle: String,
    metric: &'a Metric,
    series: &'a [Series],
    legend_title: String,
}

/// A y tick label short enough for the label area: 4 significant digits at most, `k` above 10⁴.
fn tick_label(y: f64) -> String {
    if y == 0.0 || !y.is_finite() {
        return format!("{y}");
    }
    if y.abs() >= 1e4 {
        return format!("{}k", tick_label(y / 1000.0));
    }
    let magnitude = y.abs().log10().floor() as i32;
    let decimals = (3 - magnitude).clamp(0, 8) as usize;
    let text = format!("{y:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

impl Chart<'_> {
    /// The chart as SVG text, written to its file whole by the caller.
    fn draw(&self) -> DrawResult<String> {
        let legend_w = self.legend_width()?;
        let size = (PLOT_SIZE.0 + legend_w, PLOT_SIZE.1);
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
            root.fill(&WHITE)?;
            let body = root.titled(self.title, (FONT, 28))?.titled(
                &self.subtitle,
                (FONT, 17).into_font().color(&RGBColor(80, 80, 80)),
            )?;
            let (plot_area, legend_area) = body.split_horizontally(PLOT_SIZE.0);
            self.draw_plot(&plot_area)?;
            self.draw_legend(&legend_area)?;
            root.present()?;
        }
        Ok(svg)
    }

    fn legend_width(&self) -> DrawResult<u32> {
        let mut scratch = String::new();
        let probe = SVGBackend::with_string(&mut scratch, (1, 1)).into_drawing_area();
        let style = TextStyle::from((FONT, LEGEND_FONT).into_font());
        let mut width = 0;
        for s in self.series {
            width = width.max(probe.estimate_text_size(&s.name, &style)?.0);
        }
        Ok(width + 80)
    }

    fn x_range(&self) -> (f64, f64, Vec<f64>) {
        let ns: BTreeSet<u64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0 as u64))
            .collect();
        let ticks: Vec<f64> = ns.iter().map(|n| *n as f64).collect();
        let lo = ticks.first().copied().unwrap_or(1.0);
        let hi = ticks.last().copied().unwrap_or(1.0);
        (lo / 1.25, hi * 1.25, ticks)
    }

    fn y_max(&self) -> f64 {
        let max = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0f64, f64::max);
        if max > 0.0 {
            max * 1.08
        } else {
            1.0
        }
    }

    fn draw_plot(&self, area: &Area) -> DrawResult<()> {
        let (x_lo, x_hi, ticks) = self.x_range();
        let mut chart = ChartBuilder::on(area)
            .margin(16)
            .margin_right(24)
            .x_label_area_size(60)
            .y_label_area_size(90)
            .build_cartesian_2d(
                (x_lo..x_hi).log_scale().with_key_points(ticks),
                0.0..self.y_max(),
            )?;
        chart
            .configure_mesh()
            .x_desc("N, trainings at once (log scale)")
            .y_desc(self.metric.y_desc)
            .x_label_formatter(&|n| format!("{n:.0}"))
            .y_label_formatter(&|y| tick_label(*y))
            .axis_desc_style((FONT, 19))
            .label_style((FONT, 17))
            .bold_line_style(RGBColor(220, 220, 220))
            .max_light_lines(1)
            .light_line_style(RGBColor(240, 240, 240))
            .draw()?;
        for (i, s) in self.series.iter().enumerate() {
            let c = color(i);
            chart.draw_series(LineSeries::new(s.line.iter().copied(), c.stroke_width(2)))?;
            chart.draw_series(s.points.iter().map(|p| Circle::new(*p, 4, c.filled())))?;
        }
        Ok(())
    }

    fn draw_legend(&self, area: &Area) -> DrawResult<()> {
        let text = |s: &str, y: i32, bold: bool| {
            let font = if bold {
                (FONT, LEGEND_FONT).into_font().style(FontStyle::Bold)
            } else {
                (FONT, LEGEND_FONT).into_font()
            };
            let style = font
                .into_text_style(area)
                .pos(Pos::new(HPos::Left, VPos::Center));
            Text::new(s.to_string(), (14 + if bold { 0 } else { 38 }, y), style)
        };
        area.draw(&text(&self.legend_title, 40, true))?;
        for (i, s) in self.series.iter().enumerate() {
            let y = 72 + 28 * i as i32;
            let c = color(i);
            area.draw(&PathElement::new(vec![(14, y), (44, y)], c.stroke_width(2)))?;
            area.draw(&Circle::new((29, y), 4, c.filled()))?;
            area.draw(&text(&s.name, y, false))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::run_row;

    fn rounds() -> Vec<RunRow> {
        let mut rows = Vec::new();
        for (i, n) in [1u32, 2, 3, 5, 8, 13, 21, 34].into_iter().enumerate() {
            let f = f64::from(n);
            rows.push(run_row("shared", n, 6.0 - 0.1 * i as f64));
            rows.push(run_row("process", n, 6.5 / f.sqrt() + 0.4));
            rows.push(run_row("green", n, 6.0 / f.powf(0.7) + 0.3));
        }
        rows
    }

    #[test]
    fn time_chart_has_every_series_and_the_device() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.svg");
        plot_time_per_training(&rounds(), &path, "time per training").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("<svg"));
        for name in [
            "shared",
            "process",
            "green",
            "cpu: 2 cores",
            "time per training (s)",
        ] {
            assert!(svg.contains(name), "{name} missing");
        }
        for tick in [">\n13\n<", ">\n21\n<", ">\n34\n<"] {
            assert!(svg.contains(tick), "x tick {tick} missing");
        }
    }

    #[test]
    fn series_are_prefixed_only_by_what_varies() {
        let mut rows = rounds();
        rows[0].model = "cnn".into();
        let series = collect_series(&rows, &TIME_PER_TRAINING);
        let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            vec!["cnn: shared", "mlp: shared", "mlp: process", "mlp: green"]
        );
        let plain = collect_series(&rounds(), &SAMPLES_PER_S);
        assert_eq!(plain[0].name, "shared");
        assert_eq!(plain[0].line.len(), 8);
    }

    #[test]
    fn rounds_without_a_completed_trial_are_left_out() {
        let mut rows = rounds();
        rows.iter_mut()
            .filter(|r| r.split == "green")
            .for_each(|r| r.ok = 0);
        rows[0].ok = 0;
        let series = collect_series(&rows, &TIME_PER_TRAINING);
        assert_eq!(series.len(), 2);
        assert_eq!(series[0].line.first().map(|p| p.0), Some(2.0));
    }

    #[test]
    fn repeated_rounds_draw_their_mean() {
        let rows = vec![run_row("mps", 2, 1.0), run_row("mps", 2, 3.0)];
        let series = collect_series(&rows, &TIME_PER_TRAINING);
        assert_eq!(series[0].line, vec![(2.0, 2.0)]);
        assert_eq!(series[0].points.len(), 2);
    }

    #[test]
    fn tick_labels_are_short() {
        let got: Vec<String> = [
            0.0,
            0.05,
            0.30000000000000004,
            7.0,
            150.0,
            2500.7,
            200_000.0,
            12_500.0,
        ]
        .into_iter()
        .map(tick_label)
        .collect();
        assert_eq!(
            got,
            vec!["0", "0.05", "0.3", "7", "150", "2501", "200k", "12.5k"]
        );
    }

    #[test]
    fn samples_chart_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.svg");
        plot_samples_per_s(&rounds(), &path, "samples/s").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("samples/s, all N") && svg.contains("green")
        );
    }

    #[test]
    fn a_single_round_plots() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("one.svg");
        let mut row = run_row("logical", 1, 0.0);
        row.samples_per_s = f64::INFINITY;
        plot_time_per_training(std::slice::from_ref(&row), &path, "one").unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().contains("logical"));
        let err = plot_samples_per_s(&[row], &path, "one").unwrap_err();
        assert!(matches!(err, ReportError::Invalid(_)), "{err}");
    }

    #[test]
    fn nothing_to_plot_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.svg");
        let err = plot_time_per_training(&[], &path, "t").unwrap_err();
        assert!(matches!(err, ReportError::Invalid(_)));
        let mut failed = rounds();
        failed.iter_mut().for_each(|r| r.ok = 0);
        assert!(!samples_per_s_plottable(&failed) && !time_per_training_plottable(&failed));
        assert!(time_per_training_plottable(&rounds()));
        let err = plot_samples_per_s(&failed, &path, "t").unwrap_err();
        assert!(err.to_string().contains("no round with a completed trial"));
        assert!(!path.exists());
    }
}
