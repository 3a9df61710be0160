//! `bench --charts DIR`: SVG charts (plotters) of throughput and per-core efficiency vs shard
//! count, latency percentiles per shard count, and per-shard CPU bars (issue 10 section 2).
//!
//! Pure drawing of figures already in the reports: must never compute a figure the report does
//! not hold (a count without a CPU figure has no point, never a zero). The SVG backend writes
//! `<text>` elements for the viewer to render, so no system font is read.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{SegmentValue, SegmentedCoord};
use plotters::coord::types::RangedCoordusize;
use plotters::prelude::*;

use super::report::{LatencySummary, RunReport};
use super::sweep::{CountSummary, Spread};

/// The file names written into `DIR`, in the order [`write_charts`] returns them.
pub const THROUGHPUT_CHART: &str = "throughput.svg";
pub const EFFICIENCY_CHART: &str = "efficiency.svg";
pub const LATENCY_CHART: &str = "latency.svg";
pub const SHARD_CPU_CHART: &str = "shard_cpu.svg";

/// Chart size in pixels (width, height).
const CHART_SIZE: (u32, u32) = (900, 540);

/// Colours per series, in order (plotters' palette of distinguishable colours).
const SERIES_COLOURS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

/// Writes every chart into `dir` (created if missing); returns the files written:
/// [`THROUGHPUT_CHART`], [`EFFICIENCY_CHART`], [`LATENCY_CHART`], [`SHARD_CPU_CHART`]. Each is
/// written even when it has nothing to show (no CPU figures, a single run), saying so in its
/// title, so that the set of files does not depend on the run.
///
/// # Errors
/// `dir` cannot be created or a chart cannot be drawn (named in the error).
pub fn write_charts(
    dir: &Path,
    runs: &[RunReport],
    summaries: &[CountSummary],
) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create --charts {}", dir.display()))?;
    let counts: Vec<u16> = summaries.iter().map(|summary| summary.shards).collect();
    Ok(vec![
        write_one(dir, THROUGHPUT_CHART, |path| {
            draw_throughput(path, &counts, summaries)
        })?,
        write_one(dir, EFFICIENCY_CHART, |path| {
            draw_efficiency(path, &counts, summaries)
        })?,
        write_one(dir, LATENCY_CHART, |path| draw_latency(path, &counts, runs))?,
        write_one(dir, SHARD_CPU_CHART, |path| {
            draw_shard_cpu(path, &counts, runs)
        })?,
    ])
}

/// Draws `dir/name` with `draw`, naming the file in the error.
fn write_one(
    dir: &Path,
    name: &str,
    draw: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    draw(&path).with_context(|| format!("cannot draw chart {}", path.display()))?;
    Ok(path)
}

/// One line on a chart: a name and, per shard count (in `counts` order), its spread if any.
struct Series {
    name: String,
    points: Vec<Option<Spread>>,
}

/// The x axis: one segment per shard count, labelled with the count.
type CountAxis = SegmentedCoord<RangedCoordusize>;

fn count_axis(counts: &[u16]) -> CountAxis {
    // At least one segment, so that a report with no runs still draws an (empty) chart.
    (0..counts.len().max(1) - 1).into_segmented()
}

fn count_label(counts: &[u16], value: &SegmentValue<usize>) -> String {
    match value {
        SegmentValue::CenterOf(index) => counts
            .get(*index)
            .map(ToString::to_string)
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// The largest max of `series`, or 1 when there is none (an empty chart still has an axis).
fn y_max(series: &[Series]) -> f64 {
    series
        .iter()
        .flat_map(|series| series.points.iter().flatten())
        .map(|spread| spread.max)
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE)
}

fn new_svg(path: &Path) -> DrawingArea<SVGBackend<'_>, Shift> {
    SVGBackend::new(path, CHART_SIZE).into_drawing_area()
}

/// Draws `series` on `chart`: a line through the medians, and a min..max error bar with a dot at
/// the median per count.
fn draw_series<'a, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<CountAxis, Y>>,
    series: &[Series],
) -> anyhow::Result<()>
where
    Y: Ranged<ValueType = f64>,
{
    for (index, one) in series.iter().enumerate() {
        let colour = SERIES_COLOURS[index % SERIES_COLOURS.len()];
        let medians: Vec<(SegmentValue<usize>, f64)> = one
            .points
            .iter()
            .enumerate()
            .filter_map(|(count_index, spread)| {
                spread.map(|spread| (SegmentValue::CenterOf(count_index), spread.median))
            })
            .collect();
        chart
            .draw_series(LineSeries::new(medians.clone(), colour.stroke_width(2)))?
            .label(one.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
        chart.draw_series(
            one.points
                .iter()
                .enumerate()
                .filter_map(|(count_index, spread)| {
                    spread.map(|spread| {
                        ErrorBar::new_vertical(
                            SegmentValue::CenterOf(count_index),
                            spread.min,
                            spread.median,
                            spread.max,
                            colour.filled(),
                            12,
                        )
                    })
                }),
        )?;
        chart.draw_series(
            medians
                .into_iter()
                .map(|point| Circle::new(point, 4, colour.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// A chart of `series` (median with min..max bars) against shard count, on a linear y axis
/// from 0.
fn draw_spread_chart(
    path: &Path,
    title: &str,
    y_description: &str,
    counts: &[u16],
    series: &[Series],
) -> anyhow::Result<()> {
    let root = new_svg(path);
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(90)
        .build_cartesian_2d(count_axis(counts), 0.0..y_max(series) * 1.1)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(counts.len().max(1))
        .x_label_formatter(&|value| count_label(counts, value))
        .x_desc("shards")
        .y_desc(y_description)
        .y_label_formatter(&|value| format!("{value:.0}"))
        .draw()?;
    draw_series(&mut chart, series)?;
    root.present()?;
    Ok(())
}

fn draw_throughput(path: &Path, counts: &[u16], summaries: &[CountSummary]) -> anyhow::Result<()> {
    let series = [
        Series {
            name: "produce".to_string(),
            points: summaries
                .iter()
                .map(|summary| Some(summary.produce_msgs_per_sec))
                .collect(),
        },
        Series {
            name: "consume".to_string(),
            points: summaries
                .iter()
                .map(|summary| Some(summary.consume_msgs_per_sec))
                .collect(),
        },
    ];
    draw_spread_chart(
        path,
        "Throughput vs shard count (median, min..max over repeats)",
        "msgs/s",
        counts,
        &series,
    )
}

fn draw_efficiency(path: &Path, counts: &[u16], summaries: &[CountSummary]) -> anyhow::Result<()> {
    let series = [
        Series {
            name: "produce".to_string(),
            points: summaries
                .iter()
                .map(|summary| summary.produce_msgs_per_server_cpu_second)
                .collect(),
        },
        Series {
            name: "consume".to_string(),
            points: summaries
                .iter()
                .map(|summary| summary.consume_msgs_per_server_cpu_second)
                .collect(),
        },
    ];
    let has_figures = series
        .iter()
        .any(|one| one.points.iter().any(Option::is_some));
    let title = if has_figures {
        "Per-core efficiency vs shard count (median, min..max over repeats)"
    } else {
        "Per-core efficiency vs shard count: no CPU figures (with --addr, pass --server-pid)"
    };
    draw_spread_chart(path, title, "msgs per server-CPU-second", counts, &series)
}

/// Per count, the spread over its runs of one latency percentile (µs); `None` when no run of the
/// count recorded any latency (an empty histogram reports zeros, which are not latencies).
fn latency_points(
    counts: &[u16],
    runs: &[RunReport],
    percentile: impl Fn(&LatencySummary) -> u64,
    phase_consume: bool,
) -> Vec<Option<Spread>> {
    counts
        .iter()
        .map(|count| {
            let values: Vec<f64> = runs
                .iter()
                .filter(|run| run.shards == *count)
                .map(|run| {
                    let phase = if phase_consume {
                        &run.consume
                    } else {
                        &run.produce
                    };
                    percentile(&phase.latency_us)
                })
                .filter(|value| *value > 0)
                .map(|value| value as f64)
                .collect();
            Spread::of(&values)
        })
        .collect()
}

/// Picks one percentile out of a latency summary.
type Percentile = fn(&LatencySummary) -> u64;

fn draw_latency(path: &Path, counts: &[u16], runs: &[RunReport]) -> anyhow::Result<()> {
    let percentiles: [(&str, Percentile); 3] = [
        ("p50", |latency| latency.p50),
        ("p99", |latency| latency.p99),
        ("p99.9", |latency| latency.p999),
    ];
    let mut series = Vec::new();
    for (phase, consume) in [("produce", false), ("consume", true)] {
        for (name, percentile) in percentiles {
            series.push(Series {
                name: format!("{phase} {name}"),
                points: latency_points(counts, runs, percentile, consume),
            });
        }
    }
    let root = new_svg(path);
    root.fill(&WHITE)?;
    // Percentiles span orders of magnitude: a log axis keeps p50 readable beside p99.9.
    let y_range = (1.0..y_max(&series).max(10.0) * 2.0).log_scale();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Latency percentiles per shard count (µs, median and min..max over repeats)",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(90)
        .build_cartesian_2d(count_axis(counts), y_range)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(counts.len().max(1))
        .x_label_formatter(&|value| count_label(counts, value))
        .x_desc("shards")
        .y_desc("latency µs (log scale)")
        .y_label_formatter(&|value| format!("{value:.0}"))
        .draw()?;
    draw_series(&mut chart, &series)?;
    root.present()?;
    Ok(())
}

/// The run of `count` whose produce throughput is the median of its repeats (the lower middle
/// one for an even number): the one whose per-shard CPU is charted.
fn median_run(runs: &[RunReport], count: u16) -> Option<&RunReport> {
    let mut of_count: Vec<&RunReport> = runs.iter().filter(|run| run.shards == count).collect();
    of_count.sort_by(|a, b| a.produce.msgs_per_sec.total_cmp(&b.produce.msgs_per_sec));
    of_count.get(of_count.len().saturating_sub(1) / 2).copied()
}

/// One bar: the shard count and shard it belongs to, and the shard thread's busy cores (CPU
/// seconds over the phase's elapsed seconds) in the produce phase.
struct ShardBar {
    count_index: usize,
    label: String,
    busy_cores: f64,
}

fn shard_bars(counts: &[u16], runs: &[RunReport]) -> Vec<ShardBar> {
    let mut bars = Vec::new();
    for (count_index, count) in counts.iter().enumerate() {
        let Some(run) = median_run(runs, *count) else {
            continue;
        };
        for shard in &run.per_shard {
            let Some(cpu_seconds) = shard.produce.cpu_seconds else {
                continue;
            };
            if run.produce.elapsed_seconds > 0.0 {
                bars.push(ShardBar {
                    count_index,
                    label: format!("{count}:s{}", shard.shard),
                    busy_cores: cpu_seconds / run.produce.elapsed_seconds,
                });
            }
        }
    }
    bars
}

fn draw_shard_cpu(path: &Path, counts: &[u16], runs: &[RunReport]) -> anyhow::Result<()> {
    let bars = shard_bars(counts, runs);
    let title = if bars.is_empty() {
        "Per-shard CPU: no CPU figures (with --addr, pass --server-pid)"
    } else {
        "Per-shard CPU, produce phase, median run of each count (busy cores = cpu-s / s)"
    };
    let root = new_svg(path);
    root.fill(&WHITE)?;
    let labels: Vec<&str> = bars.iter().map(|bar| bar.label.as_str()).collect();
    let busy_max = bars.iter().map(|bar| bar.busy_cores).fold(0.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(90)
        .build_cartesian_2d(
            (0..bars.len().max(1) - 1).into_segmented(),
            0.0..(busy_max * 1.1).max(1.0),
        )?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len().max(1))
        .x_label_formatter(&|value| match value {
            SegmentValue::CenterOf(index) => labels
                .get(*index)
                .map(ToString::to_string)
                .unwrap_or_default(),
            _ => String::new(),
        })
        .x_desc("shard count : shard")
        .y_desc("shard thread CPU, busy cores")
        .y_label_formatter(&|value| format!("{value:.2}"))
        .draw()?;
    chart.draw_series(
        Histogram::vertical(&chart)
            .margin(4)
            .style_func(|x, _| {
                let bar_index = match x {
                    SegmentValue::Exact(index) | SegmentValue::CenterOf(index) => *index,
                    SegmentValue::Last => 0,
                };
                let count_index = bars.get(bar_index).map_or(0, |bar| bar.count_index);
                SERIES_COLOURS[count_index % SERIES_COLOURS.len()].filled()
            })
            .data(
                bars.iter()
                    .enumerate()
                    .map(|(bar_index, bar)| (bar_index, bar.busy_cores)),
            ),
    )?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::sweep::fixtures::{Table, runs};
    use super::super::sweep::summarize;
    use super::*;

    /// Parses `path` as XML and returns the root's tag name and every `<text>` element's text.
    fn svg_root_and_texts(path: &Path) -> (String, Vec<String>) {
        let text = std::fs::read_to_string(path).unwrap();
        let document = roxmltree::Document::parse(&text)
            .unwrap_or_else(|error| panic!("{} is not well-formed XML: {error}", path.display()));
        let root = document.root_element();
        let texts = root
            .descendants()
            .filter(|node| node.has_tag_name("text"))
            .filter_map(|node| node.text().map(|text| text.trim().to_string()))
            .collect();
        (root.tag_name().name().to_string(), texts)
    }

    fn write(table: &Table<'_>) -> (tempfile::TempDir, Vec<PathBuf>) {
        let dir = tempfile::tempdir().unwrap();
        let charts_dir = dir.path().join("charts").join("run1");
        let reports = runs(table);
        let written = write_charts(&charts_dir, &reports, &summarize(&reports)).unwrap();
        (dir, written)
    }

    fn names(written: &[PathBuf]) -> Vec<String> {
        written
            .iter()
            .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn charts_are_written_as_valid_svg() {
        let (_dir, written) = write(&[
            (
                1,
                &[(100_000.0, Some(50_000.0)), (104_000.0, Some(51_000.0))],
            ),
            (
                2,
                &[(190_000.0, Some(48_000.0)), (196_000.0, Some(47_000.0))],
            ),
            (4, &[(350_000.0, Some(44_000.0))]),
        ]);
        assert_eq!(
            names(&written),
            [
                THROUGHPUT_CHART,
                EFFICIENCY_CHART,
                LATENCY_CHART,
                SHARD_CPU_CHART
            ]
        );
        for path in &written {
            let (root, texts) = svg_root_and_texts(path);
            assert_eq!(root, "svg", "{}", path.display());
            // Axis labels name the shard counts: text renders without any system font.
            assert!(
                texts
                    .iter()
                    .any(|text| text == "shards" || text.contains("shard"))
            );
        }
        let (_, throughput) = svg_root_and_texts(&written[0]);
        for label in ["1", "2", "4", "produce", "consume", "msgs/s"] {
            assert!(
                throughput.iter().any(|text| text == label),
                "{throughput:?}"
            );
        }
        let (_, latency) = svg_root_and_texts(&written[2]);
        assert!(
            latency.iter().any(|text| text == "produce p99.9"),
            "{latency:?}"
        );
        let (_, shard_cpu) = svg_root_and_texts(&written[3]);
        for label in ["1:s0", "2:s1", "4:s3"] {
            assert!(shard_cpu.iter().any(|text| text == label), "{shard_cpu:?}");
        }
    }

    #[test]
    fn a_single_run_still_charts() {
        let (_dir, written) = write(&[(1, &[(100_000.0, Some(50_000.0))])]);
        assert_eq!(written.len(), 4);
        for path in &written {
            assert_eq!(svg_root_and_texts(path).0, "svg");
        }
    }

    #[test]
    fn charts_without_cpu_figures_say_so() {
        let (_dir, written) = write(&[(1, &[(100_000.0, None)]), (2, &[(190_000.0, None)])]);
        let (_, efficiency) = svg_root_and_texts(&written[1]);
        assert!(
            efficiency
                .iter()
                .any(|text| text.contains("no CPU figures")),
            "{efficiency:?}"
        );
        let (_, shard_cpu) = svg_root_and_texts(&written[3]);
        assert!(shard_cpu.iter().any(|text| text.contains("no CPU figures")));
    }

    #[test]
    fn median_run_is_the_middle_by_produce_throughput() {
        let reports = runs(&[(2, &[(300.0, None), (100.0, None), (200.0, None)])]);
        assert_eq!(median_run(&reports, 2).unwrap().repeat, 3);
        assert_eq!(median_run(&reports[..2], 2).unwrap().repeat, 2);
        assert!(median_run(&reports, 4).is_none());
    }

    #[test]
    fn an_uncreatable_directory_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let error = write_charts(&file.join("charts"), &[], &[]).unwrap_err();
        assert!(
            format!("{error:#}").starts_with(&format!(
                "cannot create --charts {}: ",
                file.join("charts").display()
            )),
            "{error:#}"
        );
    }
}
