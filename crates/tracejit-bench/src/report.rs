//! Presenting the results: the stdout table, JSON lines, and the markdown
//! table and SVG speedup chart written under `target/bench-report/`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::floors::{Bandwidth, GEMM_FLOOR_IMPL};
use crate::measure::Timing;
use crate::runner::{Row, Status};
use crate::verify::Tolerance;
use crate::workloads::{Mode, WorkloadSpec};

/// Everything one run measured.
#[derive(Clone, Debug)]
pub struct Results {
    /// One row per workload and mode.
    pub rows: Vec<Row>,
    /// The bandwidth floor.
    pub bandwidth: Bandwidth,
    /// The raw GEMM time of W5's products.
    pub gemm_mlp_forward: Timing,
    /// `--quick` was given.
    pub quick: bool,
    /// Threads requested.
    pub threads: usize,
    /// Bytes moved by a perfect implementation, per workload name.
    pub floor_bytes: Vec<(&'static str, f64)>,
    /// Each workload's verification tolerance and why: (name, tolerance, note).
    pub tolerances: Vec<(&'static str, Tolerance, &'static str)>,
}

impl Results {
    /// Collects rows and floors; `specs` supply the floors' byte counts.
    pub fn new(
        rows: Vec<Row>,
        specs: &[WorkloadSpec],
        bandwidth: Bandwidth,
        gemm_mlp_forward: Timing,
        quick: bool,
        threads: usize,
    ) -> Results {
        let floor_bytes = specs.iter().filter_map(|s| s.floor_bytes.map(|b| (s.name, b))).collect();
        let tolerances = specs.iter().map(|s| (s.name, s.tolerance, s.tolerance_note)).collect();
        Results { rows, bandwidth, gemm_mlp_forward, quick, threads, floor_bytes, tolerances }
    }

    /// The eager median of `workload`, µs.
    pub fn eager_median(&self, workload: &str) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.workload == workload && r.mode == Mode::Eager)
            .and_then(|r| r.timing())
            .map(|t| t.median_us)
    }

    /// `eager median / this row's median`.
    pub fn speedup(&self, row: &Row) -> Option<f64> {
        Some(self.eager_median(row.workload)? / row.timing()?.median_us)
    }

    /// The bandwidth floor of `workload`, µs (W2-W4).
    pub fn floor_us(&self, workload: &str) -> Option<f64> {
        self.floor_bytes.iter().find(|(n, _)| *n == workload).map(|&(_, b)| self.bandwidth.floor_us(b))
    }

    /// `floor / median` in percent: 100 means running at the bandwidth floor.
    pub fn floor_pct(&self, row: &Row) -> Option<f64> {
        Some(100.0 * self.floor_us(row.workload)? / row.timing()?.median_us)
    }

    /// True when some row failed (the run exits non-zero).
    pub fn any_failed(&self) -> bool {
        self.rows.iter().any(Row::failed)
    }
}

fn fmt_us(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// What one compiled call runs, in a few words: "9 kernels (4 fused, 3
/// GEMM, 2 ref) + 1 view". Native kernels and views (transposes and
/// one-index gathers, no kernel) are named only when there are some.
pub fn schedule_note(st: &tracejit::ScheduleStats) -> String {
    let gemm = match st.bf16_gemms {
        0 => format!("{} GEMM", st.gemms),
        b => format!("{} GEMM ({b} bf16)", st.gemms),
    };
    let mut parts = vec![format!("{} fused", st.regions), gemm];
    if st.native_kernels > 0 {
        parts.push(format!("{} native", st.native_kernels));
    }
    parts.push(format!("{} ref", st.fallbacks));
    let views = match st.views {
        0 => String::new(),
        1 => " + 1 view".to_string(),
        n => format!(" + {n} views"),
    };
    format!("{} kernels ({}){views}", st.kernels(), parts.join(", "))
}

/// Cells of a row: workload, mode, threads, median, min, max, vs eager,
/// first call ms, % floor, notes.
fn cells(res: &Results, row: &Row) -> [String; 10] {
    let dash = || "-".to_string();
    let label = format!("{} {}", row.id, row.workload);
    let mut notes: Vec<String> = Vec::new();
    let (median, min, max) = match &row.status {
        Status::Measured { timing, .. } => (fmt_us(timing.median_us), fmt_us(timing.min_us), fmt_us(timing.max_us)),
        Status::NotAvailable(reason) => {
            notes.push(reason.clone());
            ("n/a".to_string(), dash(), dash())
        }
        Status::Failed(reason) => {
            notes.push(format!("FAILED: {reason}"));
            ("FAILED".to_string(), dash(), dash())
        }
    };
    if let Status::Measured { timing, .. } = &row.status {
        if timing.batch > 1 {
            notes.push(format!("batches of {}", timing.batch));
        }
    }
    if let (Status::Measured { agreement, .. }, true) = (&row.status, row.mode.is_low_precision()) {
        notes.push(format!("error {:.1e} of max |f32 value|", agreement.max_scaled_err));
        if agreement.min_row_cosine > 0.0 {
            notes.push(format!("cosine >= {:.5} per row", agreement.min_row_cosine));
        }
    }
    if let Some(st) = row.schedule() {
        notes.push(schedule_note(st));
    }
    [
        label,
        row.mode.name().to_string(),
        row.threads.to_string(),
        median,
        min,
        max,
        res.speedup(row).map(|s| format!("{s:.2}x")).unwrap_or_else(dash),
        row.first_call_us().map(|us| format!("{:.2}", us / 1000.0)).unwrap_or_else(dash),
        res.floor_pct(row).map(|p| format!("{p:.0}%")).unwrap_or_else(dash),
        notes.join("; "),
    ]
}

const HEADERS: [&str; 10] =
    ["workload", "mode", "threads", "median µs", "min µs", "max µs", "vs eager", "first call ms", "% floor", "notes"];

/// The floors as lines of text.
pub fn floors_text(res: &Results) -> Vec<String> {
    let bw = &res.bandwidth;
    let mut lines = vec![
        format!(
            "memory bandwidth: {:.1} GB/s (copy of a {} MiB f32 buffer{}, read + write bytes / median time)",
            bw.gbps,
            bw.buffer_bytes >> 20,
            if res.quick { "; --quick uses 64 MiB instead of 256 MiB" } else { "" }
        ),
        format!(
            "GEMM floor of mlp_forward (64x784@784x512, 64x512@512x512, 64x512@512x10): median {} µs, min {} µs \
             [{GEMM_FLOOR_IMPL}]",
            fmt_us(res.gemm_mlp_forward.median_us),
            fmt_us(res.gemm_mlp_forward.min_us)
        ),
    ];
    for (name, bytes) in &res.floor_bytes {
        lines.push(format!(
            "bandwidth floor of {name}: {:.2} MiB moved -> {} µs",
            bytes / (1024.0 * 1024.0),
            fmt_us(bw.floor_us(*bytes))
        ));
    }
    lines
}

/// What one traced-jit call of each workload runs, one line each.
pub fn schedules_text(res: &Results) -> Vec<String> {
    res.rows
        .iter()
        .filter(|r| r.mode == Mode::TracedJit)
        .filter_map(|r| Some(format!("one traced-jit call of {} {}: {}", r.id, r.workload, r.schedule()?)))
        .collect()
}

/// Peak heap memory of one steady call of each workload, per mode, one
/// line each (workloads whose modes were all measured without the counting
/// allocator are left out): for eager, what the call allocates above the
/// heap at its start; for a traced mode, the heap above what it was before
/// the function existed (what the function keeps between calls counts).
pub fn peaks_text(res: &Results) -> Vec<String> {
    let mut lines = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for r in &res.rows {
        if seen.contains(&r.workload) {
            continue;
        }
        seen.push(r.workload);
        let parts: Vec<String> = res
            .rows
            .iter()
            .filter(|q| q.workload == r.workload)
            .filter_map(|q| Some(format!("{} {}", q.mode.name(), fmt_bytes(q.peak_bytes()?))))
            .collect();
        if !parts.is_empty() {
            lines.push(format!("peak heap of a steady call of {} {}: {}", r.id, r.workload, parts.join(", ")));
        }
    }
    lines
}

fn fmt_bytes(b: usize) -> String {
    if b >= 1 << 20 {
        format!("{:.2} MiB", b as f64 / f64::from(1u32 << 20))
    } else {
        format!("{:.1} KiB", b as f64 / 1024.0)
    }
}

/// The table printed on stdout.
pub fn table(res: &Results) -> String {
    let rows: Vec<[String; 10]> = res.rows.iter().map(|r| cells(res, r)).collect();
    let mut widths: Vec<usize> = HEADERS.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r.iter()).take(9) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let pad = widths[i].saturating_sub(c.chars().count());
            if i == 9 {
                s.push_str(c);
            } else if i <= 1 {
                s.push_str(c);
                s.push_str(&" ".repeat(pad + 2));
            } else {
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
                s.push_str("  ");
            }
        }
        s.trim_end().to_string()
    };
    let mut out = String::new();
    let header: Vec<String> = HEADERS.iter().map(|h| h.to_string()).collect();
    let _ = writeln!(out, "{}", line(&header));
    let total: usize = widths.iter().take(9).sum::<usize>() + 2 * 9 + 5;
    let _ = writeln!(out, "{}", "-".repeat(total));
    let mut last = "";
    for (r, c) in res.rows.iter().zip(&rows) {
        if !last.is_empty() && last != r.workload {
            out.push('\n');
        }
        last = r.workload;
        let _ = writeln!(out, "{}", line(c));
    }
    out.push('\n');
    for l in floors_text(res) {
        let _ = writeln!(out, "{l}");
    }
    for l in schedules_text(res).into_iter().chain(peaks_text(res)) {
        let _ = writeln!(out, "{l}");
    }
    let _ = writeln!(
        out,
        "% floor = bandwidth floor time / median (100% = at the floor). Times are per call; \
         \"batches of N\": min/max are means of N calls."
    );
    out
}

fn num(v: Option<f64>) -> Value {
    v.filter(|x| x.is_finite()).map(Value::from).unwrap_or(Value::Null)
}

/// The JSON object of one row.
pub fn row_json(res: &Results, row: &Row) -> Value {
    let mut v = json!({
        "workload": row.workload,
        "id": row.id,
        "mode": row.mode.name(),
        "threads": row.threads,
        "threads_used": row.threads_used(),
        "median_us": num(row.timing().map(|t| t.median_us)),
        "min_us": num(row.timing().map(|t| t.min_us)),
        "max_us": num(row.timing().map(|t| t.max_us)),
        "first_call_us": num(row.first_call_us()),
        "peak_bytes": row.peak_bytes().map(Value::from).unwrap_or(Value::Null),
        "speedup_vs_eager": num(res.speedup(row)),
        "floor_pct": num(res.floor_pct(row)),
    });
    let obj = v.as_object_mut().expect("an object");
    match &row.status {
        Status::Measured { timing, agreement, executor, schedule, .. } => {
            obj.insert("status".into(), "ok".into());
            obj.insert("samples".into(), timing.samples.into());
            obj.insert("batch".into(), timing.batch.into());
            obj.insert("max_abs_err".into(), num(Some(agreement.max_abs_err)));
            obj.insert("max_rel_err".into(), num(Some(agreement.max_rel_err)));
            obj.insert("error".into(), num(Some(agreement.max_scaled_err)));
            obj.insert("executor".into(), executor.map(Value::from).unwrap_or(Value::Null));
            if let Some(st) = schedule {
                obj.insert(
                    "schedule".into(),
                    json!({
                        "kernels": st.kernels(),
                        "fused_regions": st.regions,
                        "gemms": st.gemms,
                        "native_kernels": st.native_kernels,
                        "reference_ops": st.fallbacks,
                        "views": st.views,
                        "variable_reads": st.reads,
                        "variable_writes": st.writes,
                        "calls": st.calls,
                    }),
                );
            }
        }
        Status::NotAvailable(reason) => {
            obj.insert("status".into(), "n/a".into());
            obj.insert("reason".into(), reason.clone().into());
        }
        Status::Failed(reason) => {
            obj.insert("status".into(), "failed".into());
            obj.insert("reason".into(), reason.clone().into());
        }
    }
    v
}

/// Every JSON line: the floors first, then one per row.
pub fn json_lines(res: &Results) -> Vec<String> {
    let bw = &res.bandwidth;
    let g = &res.gemm_mlp_forward;
    let mut lines = vec![
        json!({
            "workload": "floor_bandwidth",
            "gbps": num(Some(bw.gbps)),
            "buffer_mib": bw.buffer_bytes >> 20,
            "copy_median_us": num(Some(bw.timing.median_us)),
        })
        .to_string(),
        json!({
            "workload": "floor_gemm_mlp_forward",
            "median_us": num(Some(g.median_us)),
            "min_us": num(Some(g.min_us)),
            "max_us": num(Some(g.max_us)),
            "gemm": GEMM_FLOOR_IMPL,
        })
        .to_string(),
    ];
    lines.extend(res.rows.iter().map(|r| row_json(res, r).to_string()));
    lines
}

/// The report as markdown: floors, then the table.
pub fn markdown(res: &Results, machine: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# tracejit-bench report\n");
    let _ = writeln!(
        out,
        "Machine: {machine}. Mode: {}. Threads: {} (`tracejit::config::set_num_threads`: the JIT's large \
         kernels and GEMMs; eager ops and the interpreter run on one).\n",
        if res.quick { "--quick (0.05 s per measurement)" } else { "full (0.5 s per measurement)" },
        res.threads
    );
    for l in floors_text(res).into_iter().chain(schedules_text(res)).chain(peaks_text(res)) {
        let _ = writeln!(out, "- {l}");
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "| {} |", HEADERS.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(HEADERS.len()));
    for r in &res.rows {
        let c = cells(res, r);
        let escaped: Vec<String> = c.iter().map(|s| s.replace('|', "\\|")).collect();
        let _ = writeln!(out, "| {} |", escaped.join(" | "));
    }
    let _ = writeln!(out, "\n% floor = bandwidth floor time / median (100% = at the floor).");
    let _ = writeln!(
        out,
        "\n## Verification\n\nEvery mode's output was compared with the eager output before timing (first call and a \
         cached call); an element passes when |got - eager| <= rtol * |eager| + atol * max|eager output|.\n"
    );
    for (name, tol, note) in &res.tolerances {
        let _ = writeln!(out, "- {name}: rtol {:e}, atol {:e} ({note})", tol.rtol, tol.atol);
    }
    out
}

/// Draws the speedup of every measured traced row over eager as a grouped
/// bar chart (log scale) into an SVG file.
pub fn speedup_svg(res: &Results, path: &Path) -> Result<(), String> {
    use plotters::prelude::*;

    let modes = [Mode::TracedInterp, Mode::TracedJit, Mode::TracedJitNoSelect];
    let colors = [RGBColor(0x9e, 0x9e, 0x9e), RGBColor(0x1f, 0x77, 0xb4), RGBColor(0xff, 0x7f, 0x0e)];
    let mut workloads: Vec<(&str, &str)> = Vec::new();
    for r in &res.rows {
        if !workloads.iter().any(|(_, n)| *n == r.workload) {
            workloads.push((r.id, r.workload));
        }
    }
    let bars: Vec<(usize, usize, f64)> = res
        .rows
        .iter()
        .filter_map(|r| {
            let w = workloads.iter().position(|(_, n)| *n == r.workload)?;
            let m = modes.iter().position(|&m| m == r.mode)?;
            Some((w, m, res.speedup(r)?))
        })
        .collect();
    // Whole decades, so the log axis gets labels on both sides of 1x.
    let lo = 10f64.powf((bars.iter().map(|b| b.2).fold(1.0f64, f64::min) * 0.8).log10().floor());
    let hi = 10f64.powf((bars.iter().map(|b| b.2).fold(1.0f64, f64::max) * 1.5).log10().ceil());
    let n = workloads.len().max(1);
    // 1-2-5 ticks over the decades.
    let mut ticks = Vec::new();
    let mut decade = lo;
    while decade < hi * 1.001 {
        ticks.extend([1.0, 2.0, 5.0].iter().map(|m| m * decade).filter(|t| *t <= hi * 1.001));
        decade *= 10.0;
    }

    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<_>| format!("drawing {}: {e:?}", path.display());
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("tracejit: speedup over eager (median per call, log scale)", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..n as f64, (lo..hi).log_scale().with_key_points(ticks))
        .map_err(err)?;
    let names: Vec<String> = workloads.iter().map(|(id, name)| format!("{id} {name}")).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 1e-6 {
                names.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("speedup vs eager (x)")
        .y_label_formatter(&|y| format!("{}x", (*y * 1000.0).round() / 1000.0))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(std::iter::once(PathElement::new(vec![(0.0, 1.0), (n as f64, 1.0)], BLACK.stroke_width(1))))
        .map_err(err)?;
    let slot = 0.8 / modes.len() as f64;
    for (mi, mode) in modes.iter().enumerate() {
        let color = colors[mi];
        let series: Vec<Rectangle<(f64, f64)>> = bars
            .iter()
            .filter(|b| b.1 == mi)
            .map(|&(w, _, s)| {
                let x0 = w as f64 + 0.1 + slot * mi as f64;
                Rectangle::new([(x0, lo), (x0 + slot * 0.9, s)], color.filled())
            })
            .collect();
        if !res.rows.iter().any(|r| r.mode == *mode) {
            continue;
        }
        chart
            .draw_series(series)
            .map_err(err)?
            .label(mode.name())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
        let labels: Vec<_> = bars
            .iter()
            .filter(|b| b.1 == mi)
            .map(|&(w, _, s)| {
                let x0 = w as f64 + 0.1 + slot * mi as f64;
                EmptyElement::at((x0, s)) + Text::new(format!("{s:.1}x"), (0, -14), ("sans-serif", 11).into_font())
            })
            .collect();
        chart.draw_series(labels).map_err(err)?;
    }
    // Modes that could not run get an "n/a" (or "FAILED") mark in their slot.
    let marks: Vec<_> = res
        .rows
        .iter()
        .filter_map(|r| {
            let w = workloads.iter().position(|(_, n)| *n == r.workload)?;
            let m = modes.iter().position(|&m| m == r.mode)?;
            let mark = match &r.status {
                Status::NotAvailable(_) => "n/a",
                Status::Failed(_) => "FAILED",
                Status::Measured { .. } => return None,
            };
            let x0 = w as f64 + 0.1 + slot * m as f64;
            let style = ("sans-serif", 10).into_font().color(&colors[m]);
            Some(EmptyElement::at((x0, lo)) + Text::new(mark.to_string(), (0, -14), style))
        })
        .collect();
    chart.draw_series(marks).map_err(err)?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Where reports go: `$CARGO_TARGET_DIR/bench-report`, else the target
/// directory holding this executable (`target/release/tracejit-bench`), else
/// the workspace's `target/bench-report`.
pub fn report_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("bench-report");
    }
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/tracejit-bench or target/<triple>/<profile>/...: the
        // nearest ancestor holding CACHEDIR.TAG is the target directory.
        for dir in exe.ancestors().skip(1).take(4) {
            if dir.join("CACHEDIR.TAG").is_file() {
                return dir.join("bench-report");
            }
        }
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-report")
}

/// A one-line description of the CPU (from /proc/cpuinfo where it exists).
pub fn machine_description() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    format!("{cpu}, {cores} cores available")
}

/// Writes `report.md`, `speedups.svg` and `results.jsonl` into `dir`;
/// returns the paths written.
pub fn write_reports(res: &Results, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let md = dir.join("report.md");
    std::fs::write(&md, markdown(res, &machine_description())).map_err(|e| format!("writing {}: {e}", md.display()))?;
    let jsonl = dir.join("results.jsonl");
    let mut text = json_lines(res).join("\n");
    text.push('\n');
    std::fs::write(&jsonl, text).map_err(|e| format!("writing {}: {e}", jsonl.display()))?;
    let svg = dir.join("speedups.svg");
    speedup_svg(res, &svg)?;
    Ok(vec![md, svg, jsonl])
}
