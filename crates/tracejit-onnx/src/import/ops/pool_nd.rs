//! `MaxPool`, `AveragePool` and `LpPool` where tracejit's 2-D pooling ops
//! do not reach: dilated windows and inputs of three or more spatial
//! axes. Composed of tensor ops (pad, strided slices, elementwise max or
//! add, a constant divisor), so gradients, the JIT and export work as for
//! any traced code.
//!
//! The input is padded (with -inf for the max, zeros otherwise) to the
//! length every window needs ([`AxisWindow::padded_len`]); then, one axis
//! at a time, the `k` taps of the window are the strided slices
//! `xp[.., j·d : j·d + (o-1)·s + 1 : s, ..]` (`j < k`) combined
//! elementwise. A box window is the product of its axes' windows, and max
//! and sum are associative and commutative, so reducing axis by axis
//! equals reducing the whole window at once (a sum only in another order)
//! and costs `Σk` slices instead of `∏k`. The max propagates NaN, as the
//! 2-D `MaxPool` does.
//!
//! An average divides the window sums by a constant: the count of the
//! window's taps on the input (`count_include_pad = 0`) or on the input and
//! its explicit pads (`= 1`), each the product of its axes' counts. A
//! `ceil_mode` window's overhang past the end padding never counts (ONNX
//! Runtime and PyTorch; the 2-D path does the same).

use tracejit_tensor::{DType, SliceSpec};
use tracejit_trace::Tensor;

use super::window_nd::{resolve, AxisWindow};
use crate::import::node::Node;
use crate::import::ops::elementwise::scalar_like;

/// The most taps (summed over the axes) a pool takes.
const MAX_TAPS: i64 = 4096;

/// What a pool computes over each window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum PoolKind {
    Max,
    /// The average; `true` counts the explicit pads.
    Average {
        count_include_pad: bool,
    },
    /// `(Σ |x|^p)^(1/p)`.
    Lp {
        p: f64,
    },
}

/// True when `n` on `x` needs this module: three or more spatial axes, or
/// a dilation other than 1.
pub(crate) fn needed(n: &Node, x: &Tensor) -> Result<bool, String> {
    let dilated = n.attr_ints("dilations")?.is_some_and(|d| d.iter().any(|&v| v != 1));
    Ok(x.rank() > 4 || dilated)
}

/// Pools `x` (`[N, C, spatial..]`, the batch may be unknown) as `n` says.
pub(crate) fn pool(n: &Node, x: &Tensor, kind: PoolKind) -> Result<Tensor, String> {
    if x.rank() < 3 {
        return Err(format!("{} needs an input of rank 3 or more, got rank {}", n.op_type, x.rank()));
    }
    if !x.dtype().is_float() {
        return Err(format!("{} of {} is not supported (a float type is)", n.op_type, x.dtype()));
    }
    let dims = x.dims();
    let spatial: Vec<usize> = dims[2..]
        .iter()
        .map(|d| d.ok_or_else(|| format!("the input's spatial dims must be known, got {dims:?}")))
        .collect::<Result<_, _>>()?;
    let k = n.attr_ints("kernel_shape")?.ok_or("kernel_shape is required")?;
    if k.len() != spatial.len() || k.iter().any(|&v| v < 1) {
        return Err(format!("kernel_shape {k:?} does not fit {} spatial axes", spatial.len()));
    }
    // One slice per tap and axis: a bound keeps a corrupt kernel_shape from
    // building a graph without end.
    if k.iter().sum::<i64>() > MAX_TAPS {
        return Err(format!("kernel_shape {k:?} has more than {MAX_TAPS} taps over its axes"));
    }
    let kernel: Vec<usize> = k.iter().map(|&v| v as usize).collect();
    let axes = resolve(n, &spatial, &kernel)?;
    // As ONNX Runtime requires (with the dilated extent): no window lies
    // wholly in the padding, and the padding stays the window's size.
    if let Some(a) = axes.iter().find(|a| a.pad_begin.max(a.pad_end) >= a.extent()) {
        return Err(format!(
            "pads ({}, {}) must be smaller than the window's extent {}",
            a.pad_begin,
            a.pad_end,
            a.extent()
        ));
    }
    Ok(match kind {
        PoolKind::Max => taps(&padded(x, &axes, f64::NEG_INFINITY), &axes, |a, b| a.maximum(&b)),
        PoolKind::Average { count_include_pad } => {
            let sums = taps(&padded(x, &axes, 0.0), &axes, |a, b| a + b);
            sums / divisor(&axes, count_include_pad, x.dtype())
        }
        PoolKind::Lp { p } => {
            let powers = x.abs().pow(scalar_like(x, p));
            taps(&padded(&powers, &axes, 0.0), &axes, |a, b| a + b).pow(scalar_like(x, 1.0 / p))
        }
    })
}

/// `x` padded on its spatial axes with `value` to each axis's padded length.
fn padded(x: &Tensor, axes: &[AxisWindow], value: f64) -> Tensor {
    let mut pads = vec![(0, 0); 2];
    pads.extend(axes.iter().map(|a| (a.pad_begin, a.pad_end_total())));
    if pads.iter().all(|&p| p == (0, 0)) {
        return x.clone();
    }
    x.pad(&pads, value)
}

/// Combines each window's taps of the padded `xp` with `combine`, axis by axis.
fn taps(xp: &Tensor, axes: &[AxisWindow], combine: impl Fn(Tensor, Tensor) -> Tensor) -> Tensor {
    let mut y = xp.clone();
    for (i, a) in axes.iter().enumerate() {
        let mut specs = vec![SliceSpec::FULL; xp.rank()];
        let mut acc: Option<Tensor> = None;
        for j in 0..a.kernel {
            let start = (j * a.dilation) as i64;
            let stop = start + ((a.out - 1) * a.stride) as i64 + 1;
            specs[2 + i] = SliceSpec { start: Some(start), stop: Some(stop), step: a.stride as i64 };
            let tap = y.slice(&specs);
            acc = Some(match acc {
                None => tap,
                Some(t) => combine(t, tap),
            });
        }
        y = acc.expect("a kernel has at least one tap");
    }
    y
}

/// The average's divisor `[1, 1, out..]`: the window's taps on the input,
/// or on the input and its explicit pads.
fn divisor(axes: &[AxisWindow], count_include_pad: bool, dtype: DType) -> Tensor {
    let mut counts = vec![1.0f64];
    for a in axes {
        let (lo, hi) = if count_include_pad {
            (0, a.pad_begin + a.input + a.pad_end)
        } else {
            (a.pad_begin, a.pad_begin + a.input)
        };
        let along = a.count(lo, hi);
        counts = counts.iter().flat_map(|&c| along.iter().map(move |&m| c * m as f64)).collect();
    }
    let mut shape = vec![1, 1];
    shape.extend(axes.iter().map(|a| a.out));
    Tensor::from_vec(counts, &shape).cast(dtype)
}
