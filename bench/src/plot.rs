//! PNG plots of a compare run (plotters): publish latency CDFs, throughput per system and
//! setting, lateness CDFs.

use std::path::{Path, PathBuf};

use anyhow::anyhow;
use hdrhistogram::Histogram;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::row::Run;

/// Writes every plot for `runs` into `out`; returns the files written.
pub(crate) fn write_all(runs: &[Run], out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let label = |r: &Run| {
        let load = r
            .offered_msgs_per_s
            .map_or(String::new(), |o| format!(" open {o:.0}/s"));
        format!(
            "{} {} {} {}/req{load}",
            r.system, r.mode, r.ack_level, r.batch
        )
    };
    let closed = |r: &&Run| r.scenario == "publish" && r.load == "closed";
    let mut written = Vec::new();

    let path = out.join("publish_latency_cdf.png");
    let root = BitMapBackend::new(&path, (1600, 700)).into_drawing_area();
    let written_path = path.clone();
    root.fill(&WHITE).map_err(plot_err)?;
    let panels = root.split_evenly((1, 2));
    let futureq: Vec<(String, &Histogram<u64>)> = runs
        .iter()
        .filter(|r| r.system == "futureq" && r.scenario == "publish")
        .map(|r| (label(r), &r.hist))
        .collect();
    cdf(
        &panels[0],
        "futureq publish latency per ack level",
        &futureq,
    )?;
    let per_message: Vec<(String, &Histogram<u64>)> = runs
        .iter()
        .filter(closed)
        .filter(|r| r.batch == 1)
        .map(|r| (label(r), &r.hist))
        .collect();
    cdf(
        &panels[1],
        "publish latency, one message per ack (closed loop 8x4)",
        &per_message,
    )?;
    root.present().map_err(plot_err)?;
    written.push(written_path);

    let path = out.join("throughput.png");
    let bars: Vec<(String, f64)> = runs
        .iter()
        .filter(closed)
        .map(|r| (label(r), r.msgs_per_s))
        .collect();
    throughput(&path, &bars)?;
    written.push(path);

    let path = out.join("lateness_cdf.png");
    let root = BitMapBackend::new(&path, (1100, 700)).into_drawing_area();
    let written_path = path.clone();
    root.fill(&WHITE).map_err(plot_err)?;
    let lateness: Vec<(String, &Histogram<u64>)> = runs
        .iter()
        .filter(|r| r.scenario == "lateness")
        .map(|r| {
            let shape = if r.msgs_per_s > 0.0 {
                format!("{:.0} due/s", r.msgs_per_s)
            } else {
                format!("burst of {}", r.hist.len())
            };
            (format!("{} {} {shape}", r.system, r.ack_level), &r.hist)
        })
        .collect();
    cdf(&root, "delivery lateness (receive - due)", &lateness)?;
    root.present().map_err(plot_err)?;
    written.push(written_path);
    Ok(written)
}

fn plot_err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing a plot: {e}")
}

/// The quantiles a CDF is drawn through: fine steps, and the tail up to the maximum.
fn quantiles() -> impl Iterator<Item = f64> {
    (0..=199)
        .map(|i| f64::from(i) / 200.0)
        .chain([0.995, 0.999, 0.9999, 1.0])
}

#[allow(clippy::cast_precision_loss)]
fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// The latency axis (ms) of non-empty histograms: from the smallest value (at least 1 µs) to
/// the largest (at least a decade up); `None` without any.
fn axis<'h>(hists: impl Iterator<Item = &'h Histogram<u64>>) -> Option<(f64, f64)> {
    let (lo, hi) = hists.fold((f64::INFINITY, 0.0f64), |(lo, hi), h| {
        (lo.min(ms(h.min())), hi.max(ms(h.max())))
    });
    let lo = lo.max(0.001);
    lo.is_finite().then(|| (lo, hi.max(lo * 10.0)))
}

/// A CDF per series on a log latency axis (ms).
fn cdf(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    title: &str,
    series: &[(String, &Histogram<u64>)],
) -> anyhow::Result<()> {
    let series: Vec<_> = series.iter().filter(|(_, h)| !h.is_empty()).collect();
    let Some((lo, hi)) = axis(series.iter().map(|(_, h)| *h)) else {
        // Nothing measured for this panel (`--only` left its system out). An empty range
        // would be infinite, and plotters' log axis loops forever on it.
        area.titled(&format!("{title}: no runs"), ("sans-serif", 22))
            .map_err(plot_err)?;
        return Ok(());
    };
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d((lo..hi * 1.2).log_scale(), 0f64..1f64)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("ms (log scale)")
        .y_desc("fraction at or below")
        .draw()
        .map_err(plot_err)?;
    for (i, (name, h)) in series.iter().enumerate() {
        let style = Palette99::pick(i).stroke_width(2);
        let points: Vec<(f64, f64)> = quantiles()
            .map(|q| (ms(h.value_at_quantile(q)).max(lo), q))
            .collect();
        chart
            .draw_series(LineSeries::new(points, style))
            .map_err(plot_err)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(plot_err)?;
    Ok(())
}

/// Horizontal bars of msgs/s, one per run, labelled.
fn throughput(path: &Path, bars: &[(String, f64)]) -> anyhow::Result<()> {
    let height = 120 + 28 * u32::try_from(bars.len()).unwrap_or(u32::MAX / 64);
    let root = BitMapBackend::new(path, (1300, height)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let max = bars.iter().map(|(_, v)| *v).fold(1.0, f64::max);
    #[allow(clippy::cast_precision_loss)]
    let n = bars.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "publish throughput, closed loop (8 connections x 4 in flight), msgs/s",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .build_cartesian_2d(0f64..max * 1.05, 0f64..n.max(1.0))
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("msgs/s")
        .draw()
        .map_err(plot_err)?;
    let colour = |name: &str| match name.split(' ').next() {
        Some("futureq") => RGBColor(90, 160, 230),
        Some("redis-zset") => RGBColor(230, 130, 110),
        _ => RGBColor(130, 200, 130),
    };
    for (i, (name, v)) in bars.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let y = n - 1.0 - i as f64;
        chart
            .draw_series([Rectangle::new(
                [(0.0, y + 0.1), (*v, y + 0.9)],
                colour(name).filled(),
            )])
            .map_err(plot_err)?;
        chart
            .draw_series([Text::new(
                format!("{name}: {v:.0}"),
                (max * 0.005, y + 0.75),
                ("sans-serif", 15),
            )])
            .map_err(plot_err)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_axis_of_no_histograms_is_none_and_otherwise_finite() {
        assert_eq!(axis(std::iter::empty()), None);
        let mut h = crate::stats::hist();
        h.record(2_000).unwrap();
        h.record(50_000).unwrap();
        let (lo, hi) = axis([&h].into_iter()).unwrap();
        assert!(
            (1.9..2.1).contains(&lo) && (49.0..51.0).contains(&hi),
            "{lo} {hi}"
        );
    }
}
