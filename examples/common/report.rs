//! What the digits examples print and draw: the epoch line, the progress
//! bar, and the loss/accuracy curve as SVG (shared by `train_digits` and
//! `train_cnn_digits`, which train different models on the same data).

use std::io::IsTerminal;
use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};

use crate::digits::EpochStats;

/// One epoch's figures as a line.
pub fn epoch_line(epoch: usize, epochs: usize, s: &EpochStats) -> String {
    format!(
        "epoch {epoch:>3}/{epochs}  train loss {:.4}  accuracy {:5.1}%  |  test loss {:.4}  accuracy {:5.1}%",
        s.train_loss,
        100.0 * s.train_accuracy,
        s.test_loss,
        100.0 * s.test_accuracy
    )
}

/// A bar on a terminal; hidden otherwise (the epoch lines still print).
pub fn progress_bar(len: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Loss (left) and accuracy (right) per epoch, train and test, as SVG.
pub fn draw_curve(curve: &[EpochStats], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;

    let err = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("drawing {}: {e:?}", path.display());
    let root = SVGBackend::new(path, (960, 400)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(480);
    let epochs = curve.len().max(1) as f64;
    let at = |i: usize| (i + 1) as f64;
    // One polyline per series (plotters' LineSeries needs a feature the
    // workspace does not enable).
    let line = |f: &dyn Fn(&EpochStats) -> f64, color: RGBColor| {
        std::iter::once(PathElement::new(
            curve.iter().enumerate().map(|(i, s)| (at(i), f(s))).collect::<Vec<_>>(),
            color,
        ))
    };
    let blue = RGBColor(0x1f, 0x77, 0xb4);
    let orange = RGBColor(0xff, 0x7f, 0x0e);

    let max_loss = curve.iter().map(|s| s.train_loss.max(s.test_loss)).fold(0.1f32, f32::max) as f64 * 1.05;
    let mut chart = ChartBuilder::on(&left)
        .caption("loss (softmax cross-entropy)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..epochs, 0.0..max_loss)
        .map_err(err)?;
    chart.configure_mesh().x_desc("epoch").x_label_formatter(&|x| format!("{x:.0}")).draw().map_err(err)?;
    chart
        .draw_series(line(&|s| s.train_loss as f64, blue))
        .map_err(err)?
        .label("train")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], blue));
    chart
        .draw_series(line(&|s| s.test_loss as f64, orange))
        .map_err(err)?
        .label("test")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], orange));
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw().map_err(err)?;

    let min_acc = curve.iter().map(|s| s.train_accuracy.min(s.test_accuracy)).fold(1.0f32, f32::min) as f64;
    let low = (min_acc * 100.0 / 10.0).floor() * 10.0;
    let mut chart = ChartBuilder::on(&right)
        .caption("accuracy (%)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..epochs, low.min(90.0)..100.0)
        .map_err(err)?;
    chart.configure_mesh().x_desc("epoch").x_label_formatter(&|x| format!("{x:.0}")).draw().map_err(err)?;
    let pct = |v: f32| 100.0 * v as f64;
    chart
        .draw_series(line(&|s| pct(s.train_accuracy), blue))
        .map_err(err)?
        .label("train")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], blue));
    chart
        .draw_series(line(&|s| pct(s.test_accuracy), orange))
        .map_err(err)?
        .label("test")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], orange));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
