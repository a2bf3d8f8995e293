//! Plots of the experiments' results, as PNG files (`--plot FILE.png`).
//!
//! The plots, each drawn from the result records of one run and nothing else:
//! - [`dlwa`]: seed 000 Figures 2 and 8 — DLWA against the number of remote write
//!   streams, one line per (mode, write size), one column per local-writer count;
//!   the remote write rate of the same points below.
//! - [`ycsb_compare`]: seed 000 §6.3 — throughput, PUT latency and GET latency
//!   (p50, p99, p99.9) per replication strategy.
//! - [`ycsb_sweep`]: seed 000 Figure 9 — median PUT and GET latency against
//!   achieved throughput under an open-loop load, one line per strategy.
//! - [`replication_cdf`]: seed 000 Figure 11 — the latency CDF of remote
//!   persistence (one replication write until its durable ACK) per strategy.
//! - [`sensitivity`]: seed 000 Figure 13, Table 2 and uniform keys —
//!   throughput, median PUT latency and DLWA per strategy against one varied
//!   parameter.
//! - [`failover`]: seed 000 Figure 14 — throughput per 100 ms of each run, with the
//!   kill, the commit of the new configuration and the moment every shard of the
//!   killed server was served again marked.
//! - [`clover`]: seed 004 Figures 2, 3 and 4 — Clover natively and through the
//!   interposer (throughput and p99 round trips against clients, throughput
//!   against the keys the switch caches, the switch's memory).
//! - [`vs_clover`]: seed 000 Figure 16 — Rowan-KV's and Clover's throughput
//!   side by side per object size and workload, with each one's DLWA.
//!
//! This module owns the look of every plot (canvas sizes, fonts, colours, axes,
//! the title and the caption), so they stay alike. Every plot's caption says
//! which timing model produced the figures (the media model's timing mode on, with
//! its bandwidth, or off), as every line the benchmarks print does.
//!
//! Text is drawn with DejaVu Sans compiled into the crate (`assets/`, with its
//! licence) and rendered by `ab_glyph`: no system font, fontconfig or font file is
//! needed at run time. Plotting must never depend on the benchmarks' internals:
//! it reads only the public result records.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::dlwa::{DlwaPoint, Mode};
use crate::ycsb::sens::{self, SensPoint, Vary};
use crate::ycsb::sweep::{SweepPoint, KEPT_UP_FRACTION_MIN};
use crate::ycsb::{YcsbResult, TIMELINE_STEP_NS};

/// The embedded typeface (DejaVu Sans 2.37; licence in `assets/`).
const FONT_TTF: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
/// The family name the font is registered under: plotters' default for axis
/// labels and legends, so every text of a chart finds it.
pub(crate) const FONT_FAMILY: &str = "sans-serif";

const TITLE_PX: u32 = 26;
const PANEL_TITLE_PX: u32 = 18;
const LABEL_PX: u32 = 15;
const CAPTION_PX: u32 = 15;
/// Height of one caption line, and the blank above the first.
const CAPTION_LINE_PX: u32 = 21;
const MARGIN_PX: u32 = 14;
/// Average advance of a caption character as a fraction of the font size
/// (DejaVu Sans), used to wrap caption lines to the canvas width.
const CAPTION_CHAR_EM: f64 = 0.48;

const DLWA_SIZE_PX: (u32, u32) = (1400, 960);
const YCSB_SIZE_PX: (u32, u32) = (1500, 640);
const SWEEP_SIZE_PX: (u32, u32) = (1500, 700);
/// Marker radius of a sweep point.
const SWEEP_MARKER_PX: i32 = 5;
const FAILOVER_WIDTH_PX: u32 = 1300;
const FAILOVER_PANEL_HEIGHT_PX: u32 = 380;
/// Bound on the runs drawn by [`failover`] (one panel each); more are an error.
pub const FAILOVER_RUNS_MAX: usize = 10;

const GREY: RGBColor = RGBColor(110, 110, 110);
/// Colours of a plot's series, in order: matplotlib's "tab10", then black. A plot
/// that cycles through fewer takes the first ones (`PALETTE.split_at(n).0`).
pub(crate) const PALETTE: [RGBColor; 11] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
];
/// Strategies in the order and colours of every plot.
const STRATEGY_COLOURS: [(&str, RGBColor); 6] = [
    ("rowan", RGBColor(31, 119, 180)),
    ("rpc", RGBColor(255, 127, 14)),
    ("rwrite", RGBColor(214, 39, 40)),
    ("batch", RGBColor(44, 160, 44)),
    ("share", RGBColor(148, 103, 189)),
    ("drpc", RGBColor(140, 86, 75)),
];
/// Per-sender WRITE logs: warm colours, one per write size.
const WRITE_COLOURS: [RGBColor; 4] = [
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
];
/// Rowan: cool colours, one per write size.
const ROWAN_COLOURS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(23, 190, 207),
    RGBColor(44, 160, 44),
    RGBColor(60, 60, 140),
];
/// p50, p99, p99.9.
const PERCENTILE_COLOURS: [RGBColor; 3] = [
    RGBColor(158, 202, 225),
    RGBColor(66, 146, 198),
    RGBColor(8, 69, 148),
];
const KILL_COLOUR: RGBColor = RGBColor(214, 39, 40);
const COMMIT_COLOUR: RGBColor = RGBColor(148, 103, 189);
const SERVED_COLOUR: RGBColor = RGBColor(44, 160, 44);
const THROUGHPUT_COLOUR: RGBColor = RGBColor(31, 119, 180);

/// Why a plot could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("plot file {0}: the name must end in .png")]
    NotPng(PathBuf),
    #[error("plot file {path}: directory {dir} does not exist")]
    NoDirectory { path: PathBuf, dir: PathBuf },
    #[error("plot file {path}: cannot write it: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("plot file {path}: {message}")]
    Draw { path: PathBuf, message: String },
    #[error("nothing to plot: {0}")]
    NoData(String),
    #[error("the embedded plot font (DejaVu Sans) could not be parsed")]
    Font,
}

pub(crate) type DrawResult<T> = Result<T, Box<dyn Error>>;
pub(crate) type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// Check, before a long run, that `path` can take a plot: it ends in `.png` and
/// its directory exists. (Whether the directory is writable shows only when the
/// file is written.)
pub fn check_target(path: &Path) -> Result<(), PlotError> {
    let is_png = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if !is_png {
        return Err(PlotError::NotPng(path.to_path_buf()));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(PlotError::NoDirectory {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
        });
    }
    Ok(())
}

/// Register the embedded font with plotters, once per process.
pub(crate) fn register_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, FONT_TTF).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::Font)
    }
}

/// Draw onto a `size` canvas with `draw` and write it to `path` as PNG.
pub(crate) fn render(
    path: &Path,
    size: (u32, u32),
    draw: impl FnOnce(&Area<'_>) -> DrawResult<()>,
) -> Result<(), PlotError> {
    check_target(path)?;
    register_font()?;
    // Create the file before drawing: the file system's answer (permission
    // denied, a directory, read-only) is clearer than the PNG encoder's.
    std::fs::File::create(path).map_err(|source| PlotError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    let drawn = {
        let root = BitMapBackend::new(path, size).into_drawing_area();
        draw(&root).and_then(|()| {
            // Written here, not when the backend is dropped: the drop ignores errors.
            root.present().map_err(|e| Box::new(e) as Box<dyn Error>)
        })
    };
    drawn.map_err(|e| {
        // No half-drawn or empty plot left behind. Best effort: the error that
        // matters is the drawing's.
        let _ = std::fs::remove_file(path);
        PlotError::Draw {
            path: path.to_path_buf(),
            message: e.to_string(),
        }
    })
}

/// What the media model's timing mode did in a run, as the caption says it.
fn timing_model(timings: impl IntoIterator<Item = (bool, Option<u64>)>) -> String {
    let mut seen: Vec<(bool, Option<u64>)> = timings.into_iter().collect();
    seen.sort_unstable();
    seen.dedup();
    let one = |(on, bandwidth): (bool, Option<u64>)| {
        match (on, bandwidth) {
        (true, Some(b)) => format!(
            "media timing ON ({} MB/s media write bandwidth per DIMM): throughput is limited by emulated PM bandwidth",
            b / 1_000_000
        ),
        (true, None) => {
            "media timing ON: throughput is limited by emulated PM bandwidth".to_string()
        }
        (false, _) => {
            "media timing OFF: DLWA is counted, throughput is not limited by emulated PM bandwidth"
                .to_string()
        }
    }
    };
    let described = match seen.as_slice() {
        [single] => one(*single),
        _ => format!(
            "mixed within this run: {}",
            seen.iter().map(|s| one(*s)).collect::<Vec<_>>().join("; ")
        ),
    };
    format!("Timing model: the Optane media model on every pool; {described}.")
}

/// Split `text` into lines of at most `chars_max` characters at spaces.
fn wrap(text: &str, chars_max: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > chars_max {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// White canvas, the title on top, the caption (wrapped) at the bottom; returns
/// the area in between for the panels.
fn frame<'a>(root: &Area<'a>, title: &str, caption: &[String]) -> DrawResult<Area<'a>> {
    root.fill(&WHITE)?;
    let (width, _) = root.dim_in_pixel();
    let chars_max =
        ((width - 2 * MARGIN_PX) as f64 / (CAPTION_PX as f64 * CAPTION_CHAR_EM)) as usize;
    let lines: Vec<String> = caption.iter().flat_map(|c| wrap(c, chars_max)).collect();
    let body = root.titled(title, (FONT_FAMILY, TITLE_PX))?;
    let (_, body_height) = body.dim_in_pixel();
    let foot_px = (lines.len() as u32 + 1) * CAPTION_LINE_PX;
    let (body, foot) = body.split_vertically(body_height.saturating_sub(foot_px));
    let style = TextStyle::from((FONT_FAMILY, CAPTION_PX)).color(&BLACK);
    for (i, line) in lines.iter().enumerate() {
        foot.draw_text(
            line,
            &style,
            (
                MARGIN_PX as i32,
                (CAPTION_LINE_PX / 2 + i as u32 * CAPTION_LINE_PX) as i32,
            ),
        )?;
    }
    Ok(body)
}

/// A legend line sample in `colour`.
fn legend_line(colour: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], colour.stroke_width(3))
}

/// A legend box sample in `colour`.
pub(crate) fn legend_box(colour: RGBColor) -> impl Fn((i32, i32)) -> Rectangle<(i32, i32)> {
    move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], colour.filled())
}

/// The label of tick `x` of a category axis (category `i` centred on x = i); every
/// other tick unlabelled.
pub(crate) fn category_label<S: AsRef<str>>(labels: &[S], x: f64) -> String {
    let i = x.round();
    if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
        labels[i as usize].as_ref().to_string()
    } else {
        String::new()
    }
}

/// A chart type of the category panels: categories at 0, 1, … across, a
/// linear value axis up.
pub(crate) type CategoryChart<'a> = ChartContext<
    'a,
    BitMapBackend<'a>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// A panel of `labels` as categories across (one at each integer, half a slot
/// of margin either side) and a linear axis from 0 to `y_hi` up, its mesh drawn.
pub(crate) fn category_chart<'a, S: AsRef<str>>(
    area: &Area<'a>,
    caption: &str,
    labels: &[S],
    x_desc: &str,
    y_desc: &str,
    y_hi: f64,
) -> DrawResult<CategoryChart<'a>> {
    let n = labels.len();
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT_FAMILY, PANEL_TITLE_PX))
        .margin(MARGIN_PX)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5..(n as f64 - 0.5), 0.0..y_hi.max(1e-3))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n.max(2) * 2 + 1)
        .x_label_formatter(&|x| category_label(labels, *x))
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style((FONT_FAMILY, LABEL_PX))
        .draw()?;
    Ok(chart)
}

/// The legend of `chart`'s labelled series at `position`, on a light box.
pub(crate) fn draw_legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
    font_px: u32,
) -> DrawResult<()>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(position)
        .label_font((FONT_FAMILY, font_px))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// Caption `lines` in `area`, black, `font_px` high, the first at `top` and each
/// next `step` lower, 14 px from the left.
pub(crate) fn caption_lines(
    area: &Area<'_>,
    lines: &[String],
    font_px: u32,
    top: i32,
    step: i32,
) -> DrawResult<()> {
    let style = TextStyle::from((FONT_FAMILY, font_px)).color(&BLACK);
    for (i, line) in lines.iter().enumerate() {
        area.draw_text(line, &style, (14, top + step * i as i32))?;
    }
    Ok(())
}

fn strategy_colour(name: &str) -> RGBColor {
    STRATEGY_COLOURS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(GREY, |(_, c)| *c)
}

/// YCSB's name of a workload: A, B, … (the load phase keeps its name).
fn workload_name(workload: &str) -> String {
    if workload.len() == 1 {
        workload.to_uppercase()
    } else {
        workload.to_string()
    }
}

/// `n` with a comma between thousands: 100,000.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// `lo..hi` padded so that a flat or single-valued series still has a range.
fn padded(lo: f64, hi: f64, fraction: f64, at_least: f64) -> (f64, f64) {
    let pad = ((hi - lo) * fraction).max(at_least);
    (lo - pad, hi + pad)
}

// ---------------------------------------------------------------------------
// DLWA (seed 000 Figures 2 and 8)

/// DLWA (and the remote write rate) against the number of remote write streams:
/// one column per local-writer count, one line per (mode, write size).
pub fn dlwa(points: &[DlwaPoint], path: &Path) -> Result<(), PlotError> {
    if points.is_empty() {
        return Err(PlotError::NoData("the DLWA run has no points".into()));
    }
    let mut locals: Vec<usize> = points.iter().map(|p| p.local_writer_count).collect();
    locals.sort_unstable();
    locals.dedup();
    let mut sizes: Vec<usize> = points.iter().map(|p| p.write_size_bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let remote_ops: u64 = points.iter().map(|p| p.remote_ops).max().unwrap_or(0);
    let caption = vec![
        timing_model(
            points
                .iter()
                .map(|p| (p.media_timing, p.media_write_bytes_per_sec_per_dimm)),
        ),
        format!(
            "DLWA = media bytes / request bytes over each point's measured window (local writes included). \
             Up to {} measured remote writes per point, loopback fabric, emulated PM on the receiver.",
            thousands(remote_ops)
        ),
    ];
    render(path, DLWA_SIZE_PX, |root| {
        let body = frame(
            root,
            "DLWA of many WRITE streams vs one Rowan stream (seed 000 Fig. 2 / Fig. 8)",
            &caption,
        )?;
        let rows = body.split_evenly((2, locals.len()));
        let (cols, dlwa_row) = (locals.len(), &rows[..locals.len()]);
        let rate_row = &rows[cols..];
        let senders_max = points.iter().map(|p| p.senders).max().unwrap_or(1).max(1) as f64;
        let x_range = 0.0..senders_max * 1.05;
        let (dlwa_lo, dlwa_hi) = padded(
            points.iter().map(|p| p.dlwa).fold(f64::INFINITY, f64::min),
            points.iter().map(|p| p.dlwa).fold(0.0, f64::max),
            0.08,
            0.02,
        );
        let rate_hi = points
            .iter()
            .map(|p| p.ops_per_sec / 1e6)
            .fold(0.0, f64::max)
            .max(1e-3)
            * 1.15;
        for (col, &local) in locals.iter().enumerate() {
            let letter = (b'a' + col as u8) as char;
            let which = if local == 0 {
                "no local writers".to_string()
            } else {
                format!("{local} local writers on the receiver")
            };
            let panel = |metric: fn(&DlwaPoint) -> f64,
                         area: &Area<'_>,
                         title: String,
                         y: std::ops::Range<f64>,
                         y_desc: &str,
                         legend: bool|
             -> DrawResult<()> {
                let mut chart = ChartBuilder::on(area)
                    .caption(title, (FONT_FAMILY, PANEL_TITLE_PX))
                    .margin(MARGIN_PX)
                    .x_label_area_size(40)
                    .y_label_area_size(60)
                    .build_cartesian_2d(x_range.clone(), y)?;
                chart
                    .configure_mesh()
                    .x_label_formatter(&|x| format!("{x:.0}"))
                    .x_desc("remote write streams (senders)")
                    .y_desc(y_desc)
                    .label_style((FONT_FAMILY, LABEL_PX))
                    .draw()?;
                for mode in [Mode::Write, Mode::Rowan] {
                    for (i, &size) in sizes.iter().enumerate() {
                        let mut line: Vec<(f64, f64)> = points
                            .iter()
                            .filter(|p| {
                                p.mode == mode
                                    && p.write_size_bytes == size
                                    && p.local_writer_count == local
                            })
                            .map(|p| (p.senders as f64, metric(p)))
                            .collect();
                        if line.is_empty() {
                            continue;
                        }
                        line.sort_by(|a, b| a.0.total_cmp(&b.0));
                        let colour = match mode {
                            Mode::Write => WRITE_COLOURS[i % WRITE_COLOURS.len()],
                            Mode::Rowan => ROWAN_COLOURS[i % ROWAN_COLOURS.len()],
                        };
                        chart
                            .draw_series(
                                LineSeries::new(line, colour.stroke_width(2)).point_size(4),
                            )?
                            .label(format!("{mode} {size} B"))
                            .legend(legend_line(colour));
                    }
                }
                if legend {
                    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft, LABEL_PX)?;
                }
                Ok(())
            };
            panel(
                |p| p.dlwa,
                &dlwa_row[col],
                format!("({letter}) DLWA, {which}"),
                dlwa_lo..dlwa_hi,
                "DLWA (media / request bytes)",
                true,
            )?;
            panel(
                |p| p.ops_per_sec / 1e6,
                &rate_row[col],
                format!("({letter}') remote writes, {which}"),
                0.0..rate_hi,
                "remote writes (M/s)",
                false,
            )?;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Remote persistence latency (seed 000 Figure 11)

const CDF_SIZE_PX: (u32, u32) = (1000, 640);

/// The CDF of remote persistence latency (one replication write to one
/// backup until its durable ACK) per strategy of one YCSB run, at the
/// servers' histogram bounds (exact there), log-scale latency.
pub fn replication_cdf(results: &[YcsbResult], path: &Path) -> Result<(), PlotError> {
    let with: Vec<&YcsbResult> = results
        .iter()
        .filter(|r| !r.replication_ack_cdf.is_empty())
        .collect();
    let Some(first) = with.first() else {
        return Err(PlotError::NoData(
            "no replication ACKs were measured (RF 1, or the tcp fabric)".into(),
        ));
    };
    let caption = vec![
        timing_model(
            with.iter()
                .map(|r| (r.media_timing, r.media_write_bytes_per_sec_per_dimm)),
        ),
        format!(
            "From a primary's worker sending one replication write to one backup to the worker taking its durable ACK, \
             every write of the {:.1} s measured phase; points at the servers' histogram bounds (1 µs · 2^i), exact there. ACKs: {}.",
            first.seconds,
            with.iter()
                .map(|r| format!("{} {}", r.strategy, thousands(r.replication_acks)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ];
    let title = format!(
        "Remote persistence latency (seed 000 Fig. 11): YCSB-{}, {}, {} servers, RF {}",
        workload_name(&first.workload),
        first.sizes,
        first.servers,
        first.replication_factor
    );
    let hi = with
        .iter()
        .filter_map(|r| r.replication_ack_cdf.last().map(|(b, _)| *b))
        .fold(2.0, f64::max);
    render(path, CDF_SIZE_PX, |root| {
        let body = frame(root, &title, &caption)?;
        let mut chart = ChartBuilder::on(&body)
            .margin(MARGIN_PX)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d((1.0..hi * 1.2).log_scale(), 0.0..1.02)?;
        chart
            .configure_mesh()
            .x_desc("latency (µs, log scale)")
            .y_desc("fraction of replication writes")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.1}"))
            .label_style((FONT_FAMILY, LABEL_PX))
            .draw()?;
        for r in &with {
            let colour = strategy_colour(&r.strategy);
            chart
                .draw_series(
                    LineSeries::new(
                        r.replication_ack_cdf.iter().copied(),
                        colour.stroke_width(2),
                    )
                    .point_size(3),
                )?
                .label(r.strategy.as_str())
                .legend(legend_line(colour));
        }
        draw_legend(&mut chart, SeriesLabelPosition::LowerRight, LABEL_PX)?;
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Sensitivity (seed 000 Figure 13, Table 2, uniform keys)

const SENS_SIZE_PX: (u32, u32) = (1500, 620);

/// Throughput, median PUT latency and DLWA per strategy against the varied
/// parameter of one `bench sens` run (its values on a categorical axis).
pub fn sensitivity(points: &[SensPoint], path: &Path) -> Result<(), PlotError> {
    let Some(first) = points.first() else {
        return Err(PlotError::NoData(
            "the sensitivity run has no points".into(),
        ));
    };
    let strategies = sens::strategies(points);
    let values = sens::values(points);
    let caption = vec![
        timing_model(
            points
                .iter()
                .map(|p| (p.media_timing, p.media_write_bytes_per_sec_per_dimm)),
        ),
        format!(
            "Closed loop, a fresh in-process cluster per strategy and value (loopback fabric). \
             Setting at the first value: {}, {} servers, RF {}, {} workers/server, {} DIMMs/server; only the varied parameter changes. Errors + timeouts: {}.",
            first.setting,
            first.servers,
            first.replication_factor,
            first.workers,
            first.dimms,
            points.iter().map(|p| p.errors).sum::<u64>()
        ),
    ];
    let title = format!(
        "{} — {} against {}",
        first.figure,
        strategies.join(", "),
        first.vary
    );
    let vary = Vary::ALL
        .into_iter()
        .find(|v| v.name() == first.vary)
        .map_or(first.vary, |v| v.axis());
    render(path, SENS_SIZE_PX, |root| {
        let body = frame(root, &title, &caption)?;
        let panels = body.split_evenly((1, 3));
        let n = values.len();
        let label_at = |x: &f64| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                values.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        type Metric = fn(&SensPoint) -> f64;
        let metrics: [(&str, &str, Metric); 3] = [
            ("Throughput", "operations per second (thousands)", |p| {
                p.ops_per_sec / 1e3
            }),
            ("Median PUT latency", "µs", |p| p.put_p50_us),
            ("DLWA (busiest server)", "media / request bytes", |p| {
                p.dlwa_max
            }),
        ];
        for (k, (name, y_desc, metric)) in metrics.iter().enumerate() {
            let hi = points.iter().map(metric).fold(0.0, f64::max).max(1e-3);
            let lo = if k == 2 {
                points
                    .iter()
                    .map(metric)
                    .fold(f64::INFINITY, f64::min)
                    .min(1.0)
            } else {
                0.0
            };
            let (lo, hi) = if k == 2 {
                padded(lo, hi, 0.08, 0.02)
            } else {
                (0.0, hi * 1.15)
            };
            let mut chart = ChartBuilder::on(&panels[k])
                .caption(*name, (FONT_FAMILY, PANEL_TITLE_PX))
                .margin(MARGIN_PX)
                .x_label_area_size(50)
                .y_label_area_size(70)
                .build_cartesian_2d(-0.5..(n as f64 - 0.5), lo..hi)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(n.max(2) * 2 + 1)
                .x_label_formatter(&label_at)
                .x_desc(vary)
                .y_desc(*y_desc)
                .label_style((FONT_FAMILY, LABEL_PX))
                .draw()?;
            for s in &strategies {
                let line: Vec<(f64, f64)> = values
                    .iter()
                    .enumerate()
                    .filter_map(|(i, v)| {
                        points
                            .iter()
                            .find(|p| &p.value == v && &p.strategy == s)
                            .map(|p| (i as f64, metric(p)))
                    })
                    .collect();
                let colour = strategy_colour(s);
                chart
                    .draw_series(LineSeries::new(line, colour.stroke_width(2)).point_size(4))?
                    .label(s.as_str())
                    .legend(legend_line(colour));
            }
            if k == 0 {
                draw_legend(&mut chart, SeriesLabelPosition::LowerLeft, LABEL_PX)?;
            }
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// YCSB, strategies side by side (seed 000 §6.3)

/// Throughput and PUT/GET latency per replication strategy of one YCSB run.
pub fn ycsb_compare(results: &[YcsbResult], path: &Path) -> Result<(), PlotError> {
    let Some(first) = results.first() else {
        return Err(PlotError::NoData("the YCSB run has no results".into()));
    };
    let caption = vec![
        timing_model(
            results
                .iter()
                .map(|r| (r.media_timing, r.media_write_bytes_per_sec_per_dimm)),
        ),
        format!(
            "Measured phase {:.1} s per strategy after loading {} objects; in-process cluster on the loopback fabric. \
             Latency: fixed-bound histograms (1 µs to 60 s, 3 significant digits), log scale. Errors + timeouts: {}.",
            first.seconds,
            thousands(first.records),
            results
                .iter()
                .map(|r| format!("{} {}", r.strategy, r.errors + r.timeouts))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ];
    let title = format!(
        "YCSB-{}, {} sizes: {} servers, RF {}, {} workers/server, {} clients — replication strategies side by side",
        workload_name(&first.workload),
        first.sizes,
        first.servers,
        first.replication_factor,
        first.workers,
        first.clients
    );
    let names: Vec<String> = results.iter().map(|r| r.strategy.clone()).collect();
    render(path, YCSB_SIZE_PX, |root| {
        let body = frame(root, &title, &caption)?;
        let panels = body.split_evenly((1, 3));
        // Strategy i is centred at i * SLOT_UNITS on an integer axis, so that bars
        // can sit side by side within its slot and the labels fall on the centres.
        const SLOT_UNITS: i32 = 100;
        let n = results.len() as i32;
        let x_range = || {
            (-SLOT_UNITS / 2..n * SLOT_UNITS - SLOT_UNITS / 2)
                .with_key_points((0..n).map(|i| i * SLOT_UNITS).collect())
        };
        let name_at = |x: &i32| {
            if x.rem_euclid(SLOT_UNITS) == 0 {
                names
                    .get((x / SLOT_UNITS) as usize)
                    .cloned()
                    .unwrap_or_default()
            } else {
                String::new()
            }
        };
        let centre = |i: usize| i as i32 * SLOT_UNITS;

        // Throughput.
        let kops: Vec<f64> = results.iter().map(|r| r.ops_per_sec / 1e3).collect();
        let hi = kops.iter().copied().fold(0.0, f64::max).max(1e-3) * 1.18;
        let mut chart = ChartBuilder::on(&panels[0])
            .caption("Throughput", (FONT_FAMILY, PANEL_TITLE_PX))
            .margin(MARGIN_PX)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x_range(), 0.0..hi)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_formatter(&name_at)
            .y_desc("operations per second (thousands)")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .label_style((FONT_FAMILY, LABEL_PX))
            .draw()?;
        let half_bar = SLOT_UNITS * 35 / 100;
        chart.draw_series(kops.iter().enumerate().map(|(i, &v)| {
            let x = centre(i);
            Rectangle::new(
                [(x - half_bar, 0.0), (x + half_bar, v)],
                strategy_colour(&names[i]).filled(),
            )
        }))?;
        let above = TextStyle::from((FONT_FAMILY, LABEL_PX))
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        chart.draw_series(
            kops.iter()
                .enumerate()
                .map(|(i, &v)| Text::new(format!("{v:.1}"), (centre(i), v), above.clone())),
        )?;

        // Latency panels: (title, p50/p99/p99.9 in µs per result, whether any
        // operation of the kind was measured).
        let latency = [
            (
                "PUT latency",
                results
                    .iter()
                    .map(|r| [r.put_p50_us, r.put_p99_us, r.put_p999_us])
                    .collect::<Vec<_>>(),
                results.iter().any(|r| r.puts > 0),
            ),
            (
                "GET latency",
                results
                    .iter()
                    .map(|r| [r.get_p50_us, r.get_p99_us, r.get_p999_us])
                    .collect(),
                results.iter().any(|r| r.gets > 0),
            ),
        ];
        for (k, (what, values, measured)) in latency.iter().enumerate() {
            let measured = *measured;
            let lo_seen = values
                .iter()
                .flatten()
                .copied()
                .filter(|&v| v > 0.0)
                .fold(f64::INFINITY, f64::min);
            let hi_seen = values.iter().flatten().copied().fold(0.0, f64::max);
            let (lo, hi) = if measured && lo_seen.is_finite() {
                (lo_seen / 2.0, hi_seen * 3.0)
            } else {
                (1.0, 10.0)
            };
            let title = if measured {
                format!("{what}: p50, p99, p99.9")
            } else {
                format!("{what}: none in this workload")
            };
            let mut chart = ChartBuilder::on(&panels[k + 1])
                .caption(title, (FONT_FAMILY, PANEL_TITLE_PX))
                .margin(MARGIN_PX)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(x_range(), (lo..hi).log_scale())?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_label_formatter(&name_at)
                .y_label_formatter(&|v| format!("{v:.0}"))
                .y_desc("µs (log scale)")
                .label_style((FONT_FAMILY, LABEL_PX))
                .draw()?;
            if !measured {
                continue;
            }
            let width = SLOT_UNITS * 24 / 100;
            for (j, label) in ["p50", "p99", "p99.9"].iter().enumerate() {
                let colour = PERCENTILE_COLOURS[j];
                chart
                    .draw_series(values.iter().enumerate().filter(|(_, v)| v[j] > 0.0).map(
                        |(i, v)| {
                            let x = centre(i) + (j as i32 - 1) * width;
                            Rectangle::new(
                                [(x - width / 2, lo), (x + width / 2, v[j])],
                                colour.filled(),
                            )
                        },
                    ))?
                    .label(*label)
                    .legend(legend_box(colour));
            }
            draw_legend(&mut chart, SeriesLabelPosition::UpperLeft, LABEL_PX)?;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Latency versus throughput, open loop (seed 000 Figure 9)

/// Median PUT and GET latency against achieved throughput: one line per
/// strategy through its points in order of offered rate (past saturation the
/// achieved rate stops growing and the line turns up), filled markers where
/// the strategy kept up with the offered rate, hollow where it fell behind.
pub fn ycsb_sweep(points: &[SweepPoint], path: &Path) -> Result<(), PlotError> {
    let Some(first) = points.first() else {
        return Err(PlotError::NoData("the sweep has no points".into()));
    };
    let mut names: Vec<&str> = Vec::new();
    for p in points {
        if !names.contains(&p.strategy.as_str()) {
            names.push(&p.strategy);
        }
    }
    let rates_per_strategy = points.len() / names.len();
    let mut caption =
        vec![timing_model(points.iter().map(|p| {
            (p.media_timing, p.media_write_bytes_per_sec_per_dimm)
        }))];
    // The wire and CPU models (modelled time), when the sweep ran with them.
    if let Some(models) = &first.models {
        caption.push(format!(
            "Also: {models}; times are modelled, not this machine's."
        ));
    }
    caption.extend(vec![
        format!(
            "Open loop: {} arrivals at each offered rate ({} rates per strategy), {} clients ({}) with at most {} \
             operations in flight each; latency measured from each operation's scheduled start, so time spent \
             behind schedule counts (coordinated omission avoided). x: operations completed per second of a \
             {:.1} s window after {} s of warm-up. Filled markers: the strategy achieved at least {:.0} % of \
             the offered rate; hollow: it fell behind. One cluster per strategy, loaded with {} objects; \
             in-process cluster on the loopback fabric. Errors + timeouts: {}.",
            first.arrivals,
            rates_per_strategy,
            first.clients,
            if first.shared_stream {
                "all replaying one workload stream"
            } else {
                "each with its own workload stream"
            },
            first.inflight_per_client_max,
            first.seconds,
            first.warmup_seconds,
            KEPT_UP_FRACTION_MIN * 100.0,
            thousands(first.records),
            names
                .iter()
                .map(|n| format!(
                    "{n} {}",
                    points
                        .iter()
                        .filter(|p| p.strategy == *n)
                        .map(|p| p.errors + p.timeouts)
                        .sum::<u64>()
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ]);
    let title = format!(
        "YCSB-{}, {} sizes: {} servers, RF {}, {} workers/server — median latency vs throughput, open loop (seed 000 Fig. 9)",
        workload_name(&first.workload),
        first.sizes,
        first.servers,
        first.replication_factor,
        first.workers,
    );
    render(path, SWEEP_SIZE_PX, |root| {
        let body = frame(root, &title, &caption)?;
        let panels = body.split_evenly((1, 2));
        let x_hi = points
            .iter()
            .map(|p| p.ops_per_sec / 1e3)
            .fold(0.0, f64::max)
            .max(1e-3)
            * 1.08;
        // (panel, the median it draws, whether any operation of the kind was measured)
        type Panel<'a> = (&'a str, fn(&SweepPoint) -> f64, bool);
        let kinds: [Panel<'_>; 2] = [
            (
                "(a) PUT",
                |p| p.put_p50_us,
                points.iter().any(|p| p.puts > 0),
            ),
            (
                "(b) GET",
                |p| p.get_p50_us,
                points.iter().any(|p| p.gets > 0),
            ),
        ];
        for ((what, median, measured), area) in kinds.iter().zip(&panels) {
            let seen: Vec<f64> = points.iter().map(median).filter(|&v| v > 0.0).collect();
            let (lo, hi) = if *measured && !seen.is_empty() {
                (
                    seen.iter().copied().fold(f64::INFINITY, f64::min) / 2.0,
                    seen.iter().copied().fold(0.0, f64::max) * 2.0,
                )
            } else {
                (1.0, 10.0)
            };
            let title = if *measured {
                format!("{what}: median latency")
            } else {
                format!("{what}: none in this workload")
            };
            let mut chart = ChartBuilder::on(area)
                .caption(title, (FONT_FAMILY, PANEL_TITLE_PX))
                .margin(MARGIN_PX)
                .x_label_area_size(45)
                .y_label_area_size(75)
                .build_cartesian_2d(0.0..x_hi, (lo..hi).log_scale())?;
            chart
                .configure_mesh()
                .x_desc("achieved throughput (thousand ops/s)")
                .y_desc("median latency, µs (log scale)")
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_label_formatter(&|v| format!("{v:.0}"))
                .label_style((FONT_FAMILY, LABEL_PX))
                .draw()?;
            if !*measured {
                continue;
            }
            for name in &names {
                let colour = strategy_colour(name);
                let mut mine: Vec<&SweepPoint> = points
                    .iter()
                    .filter(|p| p.strategy == *name && median(p) > 0.0)
                    .collect();
                mine.sort_by(|a, b| a.offered_ops_per_sec.total_cmp(&b.offered_ops_per_sec));
                let xy = |p: &SweepPoint| (p.ops_per_sec / 1e3, median(p));
                chart
                    .draw_series(LineSeries::new(
                        mine.iter().map(|p| xy(p)),
                        colour.stroke_width(2),
                    ))?
                    .label(*name)
                    .legend(legend_line(colour));
                chart.draw_series(mine.iter().map(|p| {
                    let style = if p.kept_up {
                        colour.filled()
                    } else {
                        colour.stroke_width(2)
                    };
                    Circle::new(xy(p), SWEEP_MARKER_PX, style)
                }))?;
            }
            draw_legend(&mut chart, SeriesLabelPosition::UpperLeft, LABEL_PX)?;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Failover timeline (seed 000 Figure 14)

/// A panel of a timeline in [`TIMELINE_STEP_NS`] steps: seconds across,
/// thousands per second up to `y_hi`.
fn timeline_chart<'a>(
    area: &Area<'a>,
    caption: String,
    x_hi: f64,
    y_hi: f64,
    y_desc: &str,
) -> DrawResult<
    ChartContext<
        'a,
        BitMapBackend<'a>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT_FAMILY, PANEL_TITLE_PX))
        .margin(MARGIN_PX)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_hi, 0.0..y_hi)?;
    chart
        .configure_mesh()
        .x_desc("seconds into the measured phase")
        .y_desc(y_desc)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT_FAMILY, LABEL_PX))
        .draw()?;
    Ok(chart)
}

/// A step per [`TIMELINE_STEP_NS`] bucket of `counts`: the bucket's rate in
/// thousands per second, flat across it.
fn timeline_steps(counts: &[u64]) -> Vec<(f64, f64)> {
    let step_s = TIMELINE_STEP_NS as f64 / 1e9;
    counts
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| {
            let rate = n as f64 / step_s / 1e3;
            [(i as f64 * step_s, rate), ((i + 1) as f64 * step_s, rate)]
        })
        .collect()
}

/// Throughput per timeline step of each run, with the failover events marked.
pub fn failover(runs: &[YcsbResult], path: &Path) -> Result<(), PlotError> {
    let Some(first) = runs.first() else {
        return Err(PlotError::NoData(
            "the failover benchmark has no runs".into(),
        ));
    };
    if runs.len() > FAILOVER_RUNS_MAX {
        return Err(PlotError::NoData(format!(
            "{} runs: a failover plot draws at most {FAILOVER_RUNS_MAX}",
            runs.len()
        )));
    }
    if runs.iter().all(|r| r.timeline.is_empty()) {
        return Err(PlotError::NoData(
            "the failover runs recorded no throughput timeline".into(),
        ));
    }
    let step_s = TIMELINE_STEP_NS as f64 / 1e9;
    let caption = vec![
        timing_model(
            runs.iter()
                .map(|r| (r.media_timing, r.media_write_bytes_per_sec_per_dimm)),
        ),
        format!(
            "Throughput: operations completed per {:.0} ms step of the measured phase. Marked: the kill, \
             the commit of the new configuration, and the moment every shard of the killed server was served again.",
            step_s * 1e3
        ),
    ];
    let title = format!(
        "Failover under YCSB-{} ({} objects, {} servers, RF {}): throughput timeline (seed 000 Fig. 14)",
        workload_name(&first.workload),
        thousands(first.records),
        first.servers,
        first.replication_factor
    );
    let height = FAILOVER_PANEL_HEIGHT_PX * runs.len() as u32 + 140;
    render(path, (FAILOVER_WIDTH_PX, height), |root| {
        let body = frame(root, &title, &caption)?;
        let panels = body.split_evenly((runs.len(), 1));
        let steps_max = runs.iter().map(|r| r.timeline.len()).max().unwrap_or(1);
        let x_hi = steps_max as f64 * step_s;
        let peak = runs
            .iter()
            .flat_map(|r| r.timeline.iter())
            .copied()
            .max()
            .unwrap_or(0) as f64
            / step_s
            / 1e3;
        // Headroom above the peak for the legend.
        let y_hi = peak.max(1e-3) * 1.6;
        for (run, (r, area)) in runs.iter().zip(&panels).enumerate() {
            let f = r.failover.as_ref();
            let ms = |v: Option<f64>| v.map_or("not reached".to_string(), |v| format!("{v:.1} ms"));
            let panel_title = match f {
                Some(f) => format!(
                    "run {}: s{} killed at {:.0} ms; {} ops/s over the phase",
                    run + 1,
                    f.killed,
                    f.kill_at_ms,
                    thousands(r.ops_per_sec as u64)
                ),
                None => format!(
                    "run {}: no kill; {} ops/s over the phase",
                    run + 1,
                    thousands(r.ops_per_sec as u64)
                ),
            };
            let mut chart = timeline_chart(area, panel_title, x_hi, y_hi, "ops/s (thousands)")?;
            chart
                .draw_series(
                    AreaSeries::new(
                        timeline_steps(&r.timeline),
                        0.0,
                        THROUGHPUT_COLOUR.mix(0.25),
                    )
                    .border_style(THROUGHPUT_COLOUR.stroke_width(2)),
                )?
                .label("throughput")
                .legend(legend_line(THROUGHPUT_COLOUR));
            if let Some(f) = f {
                let after = |v: Option<f64>| v.map(|v| f.kill_at_ms + v);
                let marks = [
                    (
                        Some(f.kill_at_ms),
                        format!("s{} killed", f.killed),
                        KILL_COLOUR,
                    ),
                    (
                        after(f.committed_ms),
                        format!("configuration committed (+{})", ms(f.committed_ms)),
                        COMMIT_COLOUR,
                    ),
                    (
                        after(f.all_served_ms),
                        format!(
                            "all {} shards served again (+{})",
                            f.shards_promoted,
                            ms(f.all_served_ms)
                        ),
                        SERVED_COLOUR,
                    ),
                ];
                for (at_ms, label, colour) in marks {
                    let series = match at_ms {
                        Some(at) => {
                            let x = at / 1e3;
                            vec![(x, 0.0), (x, y_hi)]
                        }
                        // Not reached: listed in the legend, nothing drawn.
                        None => Vec::new(),
                    };
                    chart
                        .draw_series(LineSeries::new(series, colour.stroke_width(2)))?
                        .label(label)
                        .legend(legend_line(colour));
                }
            }
            draw_legend(&mut chart, SeriesLabelPosition::UpperRight, LABEL_PX)?;
        }
        Ok(())
    })
}

/// Figure 15: dynamic resharding's timeline — the total throughput with the
/// hotspot, the detection and the migration's start and end marked, and
/// below it each server's served requests per step.
pub fn reshard(r: &crate::ycsb::reshard::ReshardResult, path: &Path) -> Result<(), PlotError> {
    if r.timeline.is_empty() {
        return Err(PlotError::NoData(
            "the resharding run recorded no throughput timeline".into(),
        ));
    }
    let step_s = TIMELINE_STEP_NS as f64 / 1e9;
    let caption = vec![
        "Timing model: none — the servers share this machine's cores, so a hot server is not the bottleneck \
         it would be on a machine of its own; the per-server panel shows the load the hotspot shifts and the \
         migration moves back."
            .to_string(),
        format!(
            "Throughput: operations completed per {:.0} ms step. {} of n{}'s requests shifted to shard{} on n{} at {:.1} s; \
             {} objects moved; every acknowledged write read back ({} keys, {} lost).",
            step_s * 1e3,
            "80 %",
            r.shifted_server,
            r.hot_shard,
            r.hot_server,
            r.hotspot_at_ms / 1e3,
            r.objects_moved,
            r.verified_keys,
            r.lost_writes
        ),
    ];
    let title = format!(
        "Dynamic resharding under a hotspot ({} servers, {} objects, YCSB-B uniform): timeline (seed 000 Fig. 15)",
        r.servers,
        thousands(r.records)
    );
    let x_hi = r.timeline.len() as f64 * step_s;
    let ms = |v: Option<f64>| v.map_or("not reached".to_string(), |v| format!("{v:.0} ms"));
    let marks = [
        (Some(r.hotspot_at_ms), "hotspot".to_string(), KILL_COLOUR),
        (
            r.detect_ms.map(|d| r.hotspot_at_ms + d),
            format!("overload detected (+{})", ms(r.detect_ms)),
            COMMIT_COLOUR,
        ),
        (
            r.migration_start_ms,
            "migration starts".to_string(),
            PALETTE[1],
        ),
        (
            r.migration_end_ms,
            format!("migration ends ({})", ms(r.migration_ms)),
            SERVED_COLOUR,
        ),
    ];
    render(
        path,
        (FAILOVER_WIDTH_PX, 2 * FAILOVER_PANEL_HEIGHT_PX + 160),
        |root| {
            let body = frame(root, &title, &caption)?;
            let panels = body.split_evenly((2, 1));
            let peak = r.timeline.iter().copied().max().unwrap_or(0) as f64 / step_s / 1e3;
            let y_hi = peak.max(1e-3) * 1.6;
            let mut chart = timeline_chart(
                &panels[0],
                format!(
                    "total: {:.0} ops/s before, {:.0} during the hotspot, {} after",
                    r.ops_per_sec_before,
                    r.ops_per_sec_hotspot,
                    r.ops_per_sec_after
                        .map_or("-".to_string(), |v| format!("{v:.0}"))
                ),
                x_hi,
                y_hi,
                "ops/s (thousands)",
            )?;
            chart
                .draw_series(
                    AreaSeries::new(
                        timeline_steps(&r.timeline),
                        0.0,
                        THROUGHPUT_COLOUR.mix(0.25),
                    )
                    .border_style(THROUGHPUT_COLOUR.stroke_width(2)),
                )?
                .label("throughput")
                .legend(legend_line(THROUGHPUT_COLOUR));
            for (at_ms, label, colour) in &marks {
                let series = match at_ms {
                    Some(at) => vec![(at / 1e3, 0.0), (at / 1e3, y_hi)],
                    None => Vec::new(),
                };
                chart
                    .draw_series(LineSeries::new(series, colour.stroke_width(2)))?
                    .label(label.clone())
                    .legend(legend_line(*colour));
            }
            draw_legend(&mut chart, SeriesLabelPosition::UpperRight, LABEL_PX)?;

            let peak = r
                .server_timeline
                .iter()
                .flat_map(|(_, t)| t.iter())
                .copied()
                .max()
                .unwrap_or(0) as f64
                / step_s
                / 1e3;
            let y_hi = peak.max(1e-3) * 1.5;
            let mut chart = timeline_chart(
                &panels[1],
                format!(
                "per server (busiest / average: {:.2} before, {:.2} during the hotspot, {} after)",
                r.imbalance_before,
                r.imbalance_hotspot,
                r.imbalance_after
                    .map_or("-".to_string(), |v| format!("{v:.2}"))
            ),
                x_hi,
                y_hi,
                "requests served/s (thousands)",
            )?;
            for (i, (node, t)) in r.server_timeline.iter().enumerate() {
                let colour = PALETTE[i % PALETTE.len()];
                let role = if *node == r.shifted_server {
                    " (A: requests shifted away)"
                } else if *node == r.hot_server {
                    " (B: the hot shard's primary)"
                } else {
                    ""
                };
                chart
                    .draw_series(LineSeries::new(timeline_steps(t), colour.stroke_width(2)))?
                    .label(format!("n{node}{role}"))
                    .legend(legend_line(colour));
            }
            draw_legend(&mut chart, SeriesLabelPosition::UpperRight, LABEL_PX)?;
            Ok(())
        },
    )
}

// ---------------------------------------------------------------------------
// Clover and the interposer (seed 004 Figures 2, 3 and 4)

const CLOVER_SIZE_PX: (u32, u32) = (1400, 1000);
const NATIVE_COLOUR: RGBColor = RGBColor(255, 127, 14);
const INTERPOSER_COLOUR: RGBColor = RGBColor(31, 119, 180);

/// Clover natively and behind the interposer: throughput against clients
/// (Figure 2), against the number of keys the switch caches (Figure 4), round
/// trips per operation at p99 against clients, and the switch's memory against
/// the keys it tracks (Figure 3).
pub fn clover(report: &rowankv_clover::bench::BenchReport, path: &Path) -> Result<(), PlotError> {
    if report.ycsb_a.is_empty() {
        return Err(PlotError::NoData(
            "the Clover run has no YCSB-A points".into(),
        ));
    }
    let ops = report.ycsb_a.iter().map(|p| p.ops).max().unwrap_or(0);
    let caption = vec![
        format!("Timing model: {}.", report.model),
        format!(
            "YCSB-A (50 % GET, 50 % PUT), Zipf 0.75, blocking clients, one memory node, {} operations a point; \
             the switch caches every key in the left panels, the top N of the key space on the right.",
            thousands(ops)
        ),
    ];
    let series = |mode: &str| -> Vec<&rowankv_clover::bench::BenchPoint> {
        report.ycsb_a.iter().filter(|p| p.mode == mode).collect()
    };
    let (native, interposed) = (series("native"), series("interposer"));
    render(path, CLOVER_SIZE_PX, |root| {
        let body = frame(
            root,
            "Clover: native and through the interposer (seed 004)",
            &caption,
        )?;
        let panels = body.split_evenly((2, 2));
        // Clients on a category axis (8, 16, 32, 64).
        let mut clients: Vec<usize> = report.ycsb_a.iter().map(|p| p.clients).collect();
        clients.sort_unstable();
        clients.dedup();
        let client_labels: Vec<String> = clients.iter().map(|c| c.to_string()).collect();
        let at = |c: usize| clients.iter().position(|&x| x == c).unwrap_or(0) as f64;
        type Metric = fn(&rowankv_clover::bench::BenchPoint) -> f64;
        let by_clients: [(&str, &str, Metric); 2] = [
            (
                "Throughput against clients (Figure 2)",
                "operations per second (millions)",
                |p| p.ops_per_sec / 1e6,
            ),
            ("Round trips per operation, p99", "round trips", |p| {
                p.round_trips_p99 as f64
            }),
        ];
        for (k, (name, y_desc, metric)) in by_clients.iter().enumerate() {
            let hi = report
                .ycsb_a
                .iter()
                .map(metric)
                .fold(0.0, f64::max)
                .max(1e-3)
                * 1.15;
            let mut chart = category_chart(
                &panels[if k == 0 { 0 } else { 2 }],
                name,
                &client_labels,
                "blocking clients",
                y_desc,
                hi,
            )?;
            for (label, points, colour) in [
                ("native", &native, NATIVE_COLOUR),
                (
                    "interposer, every key cached",
                    &interposed,
                    INTERPOSER_COLOUR,
                ),
            ] {
                let line: Vec<(f64, f64)> =
                    points.iter().map(|p| (at(p.clients), metric(p))).collect();
                chart
                    .draw_series(LineSeries::new(line, colour.stroke_width(2)).point_size(4))?
                    .label(label)
                    .legend(legend_line(colour));
            }
            draw_legend(&mut chart, SeriesLabelPosition::LowerRight, LABEL_PX)?;
        }
        // Figure 4: top-N cached keys at the largest client count.
        if !report.top_n.is_empty() {
            let labels: Vec<String> = report
                .top_n
                .iter()
                .map(|p| p.cached_keys.to_string())
                .collect();
            let n = labels.len();
            let native_rate = native
                .iter()
                .find(|p| p.clients == report.top_n[0].clients)
                .map(|p| p.ops_per_sec / 1e6);
            let hi = report
                .top_n
                .iter()
                .map(|p| p.ops_per_sec / 1e6)
                .chain(native_rate)
                .fold(0.0, f64::max)
                .max(1e-3)
                * 1.15;
            let mut chart = category_chart(
                &panels[1],
                &format!(
                    "Caching the top N keys, {} clients (Figure 4)",
                    report.top_n[0].clients
                ),
                &labels,
                "keys the switch caches (N, hottest first)",
                "operations per second (millions)",
                hi,
            )?;
            let line: Vec<(f64, f64)> = report
                .top_n
                .iter()
                .enumerate()
                .map(|(i, p)| (i as f64, p.ops_per_sec / 1e6))
                .collect();
            chart
                .draw_series(
                    LineSeries::new(line, INTERPOSER_COLOUR.stroke_width(2)).point_size(4),
                )?
                .label("interposer, top N cached")
                .legend(legend_line(INTERPOSER_COLOUR));
            if let Some(r) = native_rate {
                chart
                    .draw_series(LineSeries::new(
                        vec![(-0.5, r), (n as f64 - 0.5, r)],
                        NATIVE_COLOUR.stroke_width(2),
                    ))?
                    .label("native")
                    .legend(legend_line(NATIVE_COLOUR));
            }
            draw_legend(&mut chart, SeriesLabelPosition::LowerRight, LABEL_PX)?;
        }
        // Figure 3: the switch's memory.
        if !report.memory.is_empty() {
            let labels: Vec<String> = report
                .memory
                .iter()
                .map(|m| thousands(m.keys as u64))
                .collect();
            let hi = report
                .memory
                .iter()
                .map(|m| m.switch_bytes as f64 / 1024.0)
                .fold(0.0, f64::max)
                * 1.15;
            let mut chart = category_chart(
                &panels[3],
                "The switch's memory (Figure 3; counted)",
                &labels,
                "keys written through the switch",
                "KiB",
                hi,
            )?;
            chart.draw_series(report.memory.iter().enumerate().map(|(i, m)| {
                Rectangle::new(
                    [
                        (i as f64 - 0.3, 0.0),
                        (i as f64 + 0.3, m.switch_bytes as f64 / 1024.0),
                    ],
                    INTERPOSER_COLOUR.filled(),
                )
            }))?;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Rowan-KV against Clover (seed 000 Figure 16)

const VS_CLOVER_SIZE_PX: (u32, u32) = (1300, 640);

/// Figure 16: throughput of Rowan-KV and of Clover side by side, a panel per
/// object size, a pair of bars per workload, each bar labelled with its
/// throughput and DLWA; the caption gives Rowan-KV's ratios over Clover.
pub fn vs_clover(points: &[crate::vs_clover::VsPoint], path: &Path) -> Result<(), PlotError> {
    let Some(first) = points.first() else {
        return Err(PlotError::NoData("the comparison has no points".into()));
    };
    let mut sizes: Vec<&str> = Vec::new();
    let mut workloads: Vec<&str> = Vec::new();
    for p in points {
        if !sizes.contains(&p.sizes.as_str()) {
            sizes.push(&p.sizes);
        }
        if !workloads.contains(&p.workload.as_str()) {
            workloads.push(&p.workload);
        }
    }
    let ratios = crate::vs_clover::ratios(points)
        .into_iter()
        .map(|(w, s, t, d)| {
            format!(
                "YCSB-{} {s}: throughput {t:.2}×, Clover's DLWA / Rowan-KV's {d:.2}×",
                w.to_uppercase()
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let caption = vec![
        format!("Timing models: {}.", first.timing),
        format!(
            "{} blocking clients per system, YCSB scrambled Zipfian (θ 0.99); Clover natively (no interposer). \
             Rowan-KV / Clover: {ratios}.",
            first.clients
        ),
    ];
    let labels: Vec<String> = workloads
        .iter()
        .map(|w| {
            let put = match w.parse::<crate::ycsb::workload::Workload>() {
                Ok(known) if known.put_fraction() == 0.0 => " (no PUT)".to_string(),
                Ok(known) => format!(" ({} % PUT)", known.put_fraction() * 100.0),
                Err(_) => String::new(),
            };
            format!("YCSB-{}{put}", w.to_uppercase())
        })
        .collect();
    let systems = [
        ("rowan-kv", "Rowan-KV", strategy_colour("rowan")),
        ("clover", "Clover", NATIVE_COLOUR),
    ];
    render(path, VS_CLOVER_SIZE_PX, |root| {
        let body = frame(
            root,
            "Rowan-KV against Clover (seed 000 Figure 16)",
            &caption,
        )?;
        let panels = body.split_evenly((1, sizes.len().max(1)));
        for (k, size) in sizes.iter().enumerate() {
            let of_size: Vec<&crate::vs_clover::VsPoint> =
                points.iter().filter(|p| p.sizes == *size).collect();
            let hi = of_size
                .iter()
                .map(|p| p.ops_per_sec / 1e3)
                .fold(0.0, f64::max)
                * 1.3;
            let mut chart = category_chart(
                &panels[k],
                &sizes_name(size),
                &labels,
                "workload",
                "operations per second (thousands)",
                hi,
            )?;
            let above = TextStyle::from((FONT_FAMILY, LABEL_PX))
                .color(&BLACK)
                .pos(Pos::new(HPos::Center, VPos::Bottom));
            let inside = TextStyle::from((FONT_FAMILY, LABEL_PX))
                .color(&WHITE)
                .pos(Pos::new(HPos::Center, VPos::Top));
            for (j, (system, name, colour)) in systems.iter().enumerate() {
                let offset = if j == 0 { -0.18 } else { 0.18 };
                let bars: Vec<(f64, &crate::vs_clover::VsPoint)> = of_size
                    .iter()
                    .filter(|p| p.system == *system)
                    .filter_map(|p| {
                        workloads
                            .iter()
                            .position(|w| *w == p.workload)
                            .map(|i| (i as f64 + offset, *p))
                    })
                    .collect();
                chart
                    .draw_series(bars.iter().map(|(x, p)| {
                        Rectangle::new(
                            [(x - 0.16, 0.0), (x + 0.16, p.ops_per_sec / 1e3)],
                            colour.filled(),
                        )
                    }))?
                    .label(*name)
                    .legend(legend_box(*colour));
                chart.draw_series(bars.iter().map(|(x, p)| {
                    Text::new(
                        format!("{:.1} K", p.ops_per_sec / 1e3),
                        (*x, p.ops_per_sec / 1e3),
                        above.clone(),
                    )
                }))?;
                // DLWA just inside the bar's top (below it when the bar is short).
                chart.draw_series(bars.iter().map(|(x, p)| {
                    let y = p.ops_per_sec / 1e3;
                    let (at, style) = if y > hi * 0.12 {
                        (y, inside.clone())
                    } else {
                        (y + hi * 0.07, above.clone())
                    };
                    Text::new(format!("DLWA {:.2}", p.dlwa), (*x, at), style)
                }))?;
            }
            draw_legend(&mut chart, SeriesLabelPosition::UpperLeft, LABEL_PX)?;
        }
        Ok(())
    })
}

/// A panel's name for a size distribution's label (`SizeDist`'s `Display`).
fn sizes_name(label: &str) -> String {
    let fixed: Vec<&str> = label.split(':').collect();
    match fixed.as_slice() {
        ["zippydb"] => "ZippyDB objects".into(),
        ["fixed", k, v] => format!("{v} B values, {k} B keys"),
        _ => format!("{label} objects"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ycsb::{FailoverTimes, TimedEvent};

    fn dlwa_points() -> Vec<DlwaPoint> {
        let mut points = Vec::new();
        for local in [0, 18] {
            for size in [64, 128] {
                for mode in [Mode::Write, Mode::Rowan] {
                    for senders in [1, 36, 144] {
                        let dlwa = match mode {
                            Mode::Write => 1.0 + senders as f64 / 200.0 * 64.0 / size as f64,
                            Mode::Rowan => 1.0 + local as f64 / 10_000.0,
                        };
                        points.push(DlwaPoint {
                            mode,
                            write_size_bytes: size,
                            senders,
                            local_writers: local > 0,
                            local_writer_count: local,
                            dlwa,
                            ops_per_sec: 1.5e6 / dlwa,
                            local_ops_per_sec: 0.0,
                            request_bytes: 1000 * size as u64,
                            media_bytes: (1000.0 * size as f64 * dlwa) as u64,
                            remote_ops: 1000,
                            local_ops: 0,
                            media_timing: false,
                            media_write_bytes_per_sec_per_dimm: None,
                        });
                    }
                }
            }
        }
        points
    }

    fn ycsb_result(strategy: &str, ops_per_sec: f64) -> YcsbResult {
        YcsbResult {
            strategy: strategy.into(),
            workload: "a".into(),
            sizes: "zippydb".into(),
            servers: 3,
            replication_factor: 3,
            workers: 4,
            clients: 8,
            records: 20_000,
            seconds: 4.0,
            ops: (ops_per_sec * 4.0) as u64,
            ops_per_sec,
            puts: 1000,
            gets: 1000,
            put_p50_us: 80.0,
            put_p99_us: 900.0,
            put_p999_us: 4000.0,
            get_p50_us: 40.0,
            get_p99_us: 300.0,
            get_p999_us: 1200.0,
            dlwa_per_server: vec![1.0, 1.1, 1.2],
            dlwa_max: 1.2,
            request_bytes_per_op: 200.0,
            media_bytes_per_op: 240.0,
            cleaner_bytes_per_op: 20.0,
            replication_acks: 10,
            replication_ack_cdf: vec![(1.0, 0.2), (2.0, 1.0)],
            cpu_us_per_op: 12.0,
            errors: 0,
            timeouts: 0,
            load_seconds: 1.0,
            media_timing: true,
            media_write_bytes_per_sec_per_dimm: Some(4_000_000),
            timeline: Vec::new(),
            events: Vec::new(),
            failover: None,
            verified_keys: 0,
            lost_writes: 0,
            fabric: crate::ycsb::FabricKind::Loopback,
        }
    }

    fn failover_run(run: u64) -> YcsbResult {
        let mut r = ycsb_result("rowan", 30_000.0);
        // 40 steps of 100 ms: a dip after the kill at 2 s.
        r.timeline = (0..40u64)
            .map(|i| match i {
                20 => 300,
                21 => 1500,
                _ => 3000 + 37 * ((i + run) % 5),
            })
            .collect();
        r.events = vec![TimedEvent {
            at_ms: 2051.0,
            what: "configuration t2 committed".into(),
        }];
        r.failover = Some(FailoverTimes {
            killed: 2,
            kill_at_ms: 2000.0,
            detected_ms: Some(40.0),
            stored_ms: Some(45.0),
            committed_ms: Some(51.0),
            all_served_ms: if run == 0 { Some(120.0) } else { None },
            shards_promoted: 48,
            others_failed: Vec::new(),
        });
        r
    }

    /// The PNG at `path` decodes with the `size` given, is of a plausible size,
    /// and has text (dark pixels) in its title band.
    fn check_png(path: &Path, size: (u32, u32)) {
        let bytes = std::fs::metadata(path).expect("plot written").len();
        assert!(bytes > 10_000, "{}: only {bytes} bytes", path.display());
        let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
        let mut reader = decoder.read_info().expect("a PNG header");
        let mut pixels = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut pixels).expect("a PNG frame");
        assert_eq!((info.width, info.height), size, "{}", path.display());
        assert_eq!(info.color_type, png::ColorType::Rgb);
        let row = info.line_size;
        let title_dark = pixels[..row * 30]
            .chunks(3)
            .filter(|px| px.iter().all(|&c| c < 100))
            .count();
        assert!(
            title_dark > 200,
            "no title text drawn ({title_dark} dark pixels)"
        );
    }

    #[test]
    fn dlwa_plot_renders() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dlwa.png");
        dlwa(&dlwa_points(), &path).unwrap();
        check_png(&path, DLWA_SIZE_PX);
    }

    #[test]
    fn ycsb_compare_plot_renders() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ycsb.png");
        let mut results: Vec<YcsbResult> = STRATEGY_COLOURS
            .iter()
            .enumerate()
            .map(|(i, (s, _))| ycsb_result(s, 20_000.0 + 5_000.0 * i as f64))
            .collect();
        // A strategy without GETs measured must not break the log scale.
        results[1].get_p50_us = 0.0;
        ycsb_compare(&results, &path).unwrap();
        check_png(&path, YCSB_SIZE_PX);
    }

    #[test]
    fn ycsb_plot_of_a_put_only_workload_renders() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("load.png");
        let mut r = ycsb_result("rowan", 10_000.0);
        (r.gets, r.get_p50_us, r.get_p99_us, r.get_p999_us) = (0, 0.0, 0.0, 0.0);
        ycsb_compare(&[r], &path).unwrap();
        check_png(&path, YCSB_SIZE_PX);
    }

    fn sweep_points(workload: &str) -> Vec<SweepPoint> {
        let mut points = Vec::new();
        for (s, peak) in [
            ("rowan", 110_000.0),
            ("rpc", 80_000.0),
            ("share", 105_000.0),
        ] {
            for f in crate::ycsb::sweep::fractions(6) {
                let offered = f * peak;
                let achieved = offered.min(peak);
                let load = achieved / peak;
                let put = 300.0 / (1.05 - load.min(1.0)) * if f > 1.0 { 40.0 } else { 1.0 };
                points.push(SweepPoint {
                    strategy: s.into(),
                    workload: workload.into(),
                    sizes: "zippydb".into(),
                    keys: "zipfian".into(),
                    arrivals: crate::ycsb::sweep::Arrivals::Poisson,
                    shared_stream: false,
                    offered_ops_per_sec: offered,
                    offered_fraction: Some(f),
                    probe_ops_per_sec: Some(peak),
                    ops_per_sec: achieved,
                    kept_up: crate::ycsb::sweep::kept_up(offered, achieved),
                    ops: achieved as u64 * 5,
                    puts: if workload == "c" { 0 } else { 100 },
                    gets: 100,
                    put_p50_us: if workload == "c" { 0.0 } else { put },
                    put_p99_us: put * 4.0,
                    put_p999_us: put * 8.0,
                    get_p50_us: put / 2.0,
                    get_p99_us: put * 2.0,
                    get_p999_us: put * 4.0,
                    schedule_lag_ms_max: 0.0,
                    errors: 0,
                    timeouts: 0,
                    seconds: 5.0,
                    warmup_seconds: 1.0,
                    servers: 3,
                    replication_factor: 3,
                    workers: 48,
                    clients: 48,
                    inflight_per_client_max: 16,
                    records: 200_000,
                    media_timing: true,
                    media_write_bytes_per_sec_per_dimm: Some(4_000_000),
                    fabric: crate::ycsb::FabricKind::Loopback,
                    models: None,
                });
            }
        }
        points
    }

    #[test]
    fn ycsb_sweep_plot_renders() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sweep.png");
        ycsb_sweep(&sweep_points("a"), &path).unwrap();
        check_png(&path, SWEEP_SIZE_PX);
        // A read-only sweep has no PUT panel to fill.
        let path = dir.path().join("sweep-c.png");
        ycsb_sweep(&sweep_points("c"), &path).unwrap();
        check_png(&path, SWEEP_SIZE_PX);
        assert!(matches!(
            ycsb_sweep(&[], &dir.path().join("none.png")),
            Err(PlotError::NoData(_))
        ));
    }

    #[test]
    fn failover_plot_renders_one_panel_per_run() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("failover.png");
        let runs = vec![failover_run(0), failover_run(1)];
        failover(&runs, &path).unwrap();
        check_png(
            &path,
            (FAILOVER_WIDTH_PX, 2 * FAILOVER_PANEL_HEIGHT_PX + 140),
        );
    }

    #[test]
    fn bad_targets_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no/such/dir/plot.png");
        let err = dlwa(&dlwa_points(), &missing).unwrap_err();
        assert!(matches!(err, PlotError::NoDirectory { .. }), "{err}");
        assert!(err.to_string().contains("does not exist"), "{err}");

        let err = dlwa(&dlwa_points(), &dir.path().join("plot.jpg")).unwrap_err();
        assert!(err.to_string().contains("must end in .png"), "{err}");

        // A directory where the file should be: the write itself fails.
        let taken = dir.path().join("taken.png");
        std::fs::create_dir(&taken).unwrap();
        let err = dlwa(&dlwa_points(), &taken).unwrap_err();
        assert!(matches!(err, PlotError::Write { .. }), "{err}");
        assert!(err.to_string().contains("taken.png"), "{err}");
    }

    #[test]
    fn empty_results_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.png");
        assert!(matches!(dlwa(&[], &path), Err(PlotError::NoData(_))));
        assert!(matches!(
            ycsb_compare(&[], &path),
            Err(PlotError::NoData(_))
        ));
        assert!(matches!(failover(&[], &path), Err(PlotError::NoData(_))));
        assert!(!path.exists());
    }

    #[test]
    fn caption_names_the_timing_model() {
        let on = timing_model([(true, Some(4_000_000))]);
        assert!(on.contains("media timing ON (4 MB/s"), "{on}");
        let off = timing_model([(false, None), (false, None)]);
        assert!(off.contains("media timing OFF"), "{off}");
        let mixed = timing_model([(false, None), (true, Some(2_000_000_000))]);
        assert!(mixed.contains("mixed"), "{mixed}");
    }

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(100_000), "100,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn captions_wrap_at_spaces() {
        assert_eq!(wrap("aa bb cc", 5), vec!["aa bb", "cc"]);
        assert_eq!(wrap("", 5), Vec::<String>::new());
    }
}
