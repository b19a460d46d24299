//! Charts as SVG files, drawn with `plotters`: lines, or points with labels, on linear (or
//! logarithmic x) axes, with a legend. SVG only: text stays text, which any viewer renders with
//! its own fonts, so the binary carries no font and needs none installed.

use std::path::Path;

use anyhow::Context;
pub use plotters::prelude::SeriesLabelPosition;
use plotters::prelude::*;

/// One line (or set of points) of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Its name in the legend.
    pub name: String,
    /// Points, in drawing order.
    pub points: Vec<(f64, f64)>,
    /// Draw points with these labels (empty: no label) instead of a line.
    pub labels: Option<Vec<String>>,
}

impl Series {
    /// A line through `points`.
    pub fn line(name: &str, points: Vec<(f64, f64)>) -> Series {
        Series { name: name.into(), points, labels: None }
    }
}

/// A chart.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Title.
    pub title: String,
    /// Label of the x axis.
    pub x_label: String,
    /// Label of the y axis.
    pub y_label: String,
    /// What to draw.
    pub series: Vec<Series>,
    /// A logarithmic x axis (for long-tailed quantities such as latencies).
    pub log_x: bool,
    /// Start the y axis at 0 (shares, rates); otherwise at the data with a margin.
    pub y_from_zero: bool,
    /// Where the legend goes (the corner the data leaves empty).
    pub legend: SeriesLabelPosition,
}

const SIZE: (u32, u32) = (820, 480);

/// The range `values` span with a margin, widened where it is empty or a single value.
fn span(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    if !lo.is_finite() || !hi.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    if hi <= lo {
        hi = lo + lo.abs().max(1.0);
    }
    let margin = (hi - lo) * 0.04;
    (if from_zero && lo >= 0.0 { lo } else { lo - margin }, hi + margin)
}

impl Chart {
    fn finite(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        let log_x = self.log_x;
        self.series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(move |(x, y)| x.is_finite() && y.is_finite() && (!log_x || *x > 0.0))
    }

    /// The chart as SVG text.
    pub fn svg(&self) -> anyhow::Result<String> {
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
            root.fill(&WHITE).map_err(draw_error)?;
            let (y0, y1) = span(self.finite().map(|p| p.1), self.y_from_zero);
            let mut builder = ChartBuilder::on(&root);
            builder
                .caption(&self.title, ("sans-serif", 20))
                .margin(12)
                .margin_right(80)
                .x_label_area_size(44)
                .y_label_area_size(64);
            if self.log_x {
                let (lo, hi) = span(self.finite().map(|p| p.0.ln()), false);
                let (x0, x1) = (lo.exp(), hi.exp());
                let chart = builder.build_cartesian_2d((x0..x1).log_scale(), y0..y1).map_err(draw_error)?;
                self.draw(chart)?;
            } else {
                let (x0, x1) = span(self.finite().map(|p| p.0), false);
                let chart = builder.build_cartesian_2d(x0..x1, y0..y1).map_err(draw_error)?;
                self.draw(chart)?;
            }
            root.present().map_err(draw_error)?;
        }
        Ok(out)
    }

    fn draw<'a, X>(
        &self,
        mut chart: ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, plotters::coord::types::RangedCoordf64>>,
    ) -> anyhow::Result<()>
    where
        X: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
    {
        chart
            .configure_mesh()
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .light_line_style(RGBColor(238, 238, 238))
            .draw()
            .map_err(draw_error)?;
        let log_x = self.log_x;
        let keep = move |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite() && (!log_x || x > 0.0);
        for (i, s) in self.series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let points: Vec<(f64, f64)> = s.points.iter().copied().filter(keep).collect();
            let drawn = match &s.labels {
                None => chart.draw_series(LineSeries::new(points, color.stroke_width(2))).map_err(draw_error)?,
                Some(labels) => {
                    let labelled = s.points.iter().zip(labels.iter().map(String::as_str).chain(std::iter::repeat("")));
                    chart
                        .draw_series(labelled.filter(|(p, _)| keep(p)).map(|(&(x, y), label)| {
                            EmptyElement::at((x, y))
                                + Circle::new((0, 0), 4, color.filled())
                                + Text::new(label.to_string(), (6, -14), ("sans-serif", 11))
                        }))
                        .map_err(draw_error)?
                }
            };
            drawn
                .label(s.name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(3)));
        }
        if !self.series.is_empty() {
            chart
                .configure_series_labels()
                .position(self.legend.clone())
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(draw_error)?;
        }
        Ok(())
    }

    /// Writes the chart to `path`.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let svg = self.svg().with_context(|| format!("cannot draw {}", path.display()))?;
        crate::output::write_file(path, svg.as_bytes())
    }
}

fn draw_error<E: std::error::Error + Send + Sync + 'static>(e: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow::anyhow!("drawing failed: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_has_its_series_axes_and_legend() {
        let chart = Chart {
            title: "TTFT <CDF>".into(),
            x_label: "ms".into(),
            y_label: "share".into(),
            series: vec![
                Series::line("lru", vec![(1.0, 0.0), (10.0, 0.5), (20.0, 1.0)]),
                Series { name: "frontier".into(), points: vec![(5.0, 0.2)], labels: Some(vec!["a point".into()]) },
            ],
            log_x: false,
            y_from_zero: true,
            legend: SeriesLabelPosition::UpperLeft,
        };
        let svg = chart.svg().expect("draws");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        assert!(svg.contains("TTFT &lt;CDF&gt;"), "the title, escaped");
        assert!(svg.contains("polyline"), "a line series");
        assert!(svg.contains("<circle"), "a point series");
        assert!(svg.contains(">lru<") || svg.contains(">\nlru\n<"), "the legend: {svg}");
        assert!(svg.contains("a point"), "a point's label");
        let log = Chart { log_x: true, ..chart.clone() }.svg().expect("draws on a log axis");
        assert!(log.contains("polyline"));
        // An empty chart, or one with nothing finite, still draws its frame.
        let empty = Chart { series: vec![Series::line("nan", vec![(f64::NAN, 1.0)])], ..chart }.svg().expect("draws");
        assert!(empty.contains("<svg"));
    }
}
