//! `Resize` (opset 11 on) and `Upsample` (opset 7 to 9): separable
//! interpolation, one axis at a time, as ONNX's reference computes it.
//! For each resized axis the source coordinate of every output index
//! (`half_pixel`, `half_pixel_symmetric`, `pytorch_half_pixel`,
//! `align_corners`, `asymmetric`, `tf_crop_and_resize` with its roi and
//! extrapolation value), the taps around it and their weights (nearest
//! with its four rounding modes, linear, cubic with `cubic_coeff_a`,
//! antialiased linear and cubic, `exclude_outside`) are f64 constants of
//! the static sizes; the axis is then one gather of the taps and a
//! weighted sum (nearest: one gather of the chosen tap, an exact copy). `scales` or `sizes` (with `axes` and
//! `keep_aspect_ratio_policy`) and `roi` must be known at trace time.
//! `GridSample` samples at runtime coordinates: its taps are gathers.

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

use crate::import::node::{normalize_axis, Node, OpResult};

/// The attributes `Resize` reads.
pub(crate) const RESIZE_ATTRS: &[&str] = &[
    "antialias",
    "axes",
    "coordinate_transformation_mode",
    "cubic_coeff_a",
    "exclude_outside",
    "extrapolation_value",
    "keep_aspect_ratio_policy",
    "mode",
    "nearest_mode",
];

/// The most taps·outputs one axis may ask for (its constants are built here).
const MAX_ENTRIES: usize = 1 << 24;

/// How one axis is interpolated.
struct Plan<'a> {
    mode: &'a str,
    nearest: &'a str,
    coord: &'a str,
    antialias: bool,
    a: f64,
    exclude_outside: bool,
}

impl Plan<'_> {
    /// The tap weights at `ratio` ∈ (0, 1] for `scale`.
    fn coeffs(&self, ratio: f64, scale: f64) -> Vec<f64> {
        let a = self.a;
        match self.mode {
            "nearest" => {
                let near = if ratio.fract() == 0.0 {
                    true
                } else {
                    match self.nearest {
                        "round_prefer_ceil" => ratio >= 0.5,
                        "floor" => false,
                        "ceil" => true,
                        _ => ratio > 0.5,
                    }
                };
                vec![f64::from(u8::from(!near)), f64::from(u8::from(near))]
            }
            "linear" if self.antialias => {
                let s = scale.min(1.0);
                let start = (-1.0 / s).floor() as i64 + 1;
                let taps: Vec<f64> = (start..start + 2 - 2 * start)
                    .map(|i| (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0))
                    .collect();
                let sum: f64 = taps.iter().sum();
                taps.iter().map(|c| c / sum).collect()
            }
            "linear" => vec![1.0 - ratio, ratio],
            _ if self.antialias => {
                let s = scale.min(1.0);
                let cubic = |x: f64| {
                    let x = x.abs();
                    if x <= 1.0 {
                        (a + 2.0) * x * x * x - (a + 3.0) * x * x + 1.0
                    } else if x < 2.0 {
                        a * x * x * x - 5.0 * a * x * x + 8.0 * a * x - 4.0 * a
                    } else {
                        0.0
                    }
                };
                let start = (-2.0 / s).floor() as i64 + 1;
                let taps: Vec<f64> = (start..2 - start).map(|i| cubic(s * (i as f64 - ratio))).collect();
                let sum: f64 = taps.iter().sum();
                taps.iter().map(|c| c / sum).collect()
            }
            _ => {
                let (r, q) = (ratio, 1.0 - ratio);
                vec![
                    ((a * (r + 1.0) - 5.0 * a) * (r + 1.0) + 8.0 * a) * (r + 1.0) - 4.0 * a,
                    ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
                    ((a + 2.0) * q - (a + 3.0)) * q * q + 1.0,
                    ((a * (q + 1.0) - 5.0 * a) * (q + 1.0) + 8.0 * a) * (q + 1.0) - 4.0 * a,
                ]
            }
        }
    }

    /// The source coordinate of output `y`, and whether it lies outside
    /// the input (only `tf_crop_and_resize` extrapolates).
    fn source(&self, y: f64, scale: f64, input: usize, out: usize, roi: (f64, f64)) -> (f64, bool) {
        let (iw, ow) = (input as f64, scale * input as f64);
        let x = match self.coord {
            "align_corners" if ow == 1.0 => 0.0,
            "align_corners" => y * (iw - 1.0) / (ow - 1.0),
            "asymmetric" => y / scale,
            "tf_crop_and_resize" => {
                let x = if ow == 1.0 {
                    (roi.1 - roi.0) * (iw - 1.0) / 2.0
                } else {
                    y * (roi.1 - roi.0) * (iw - 1.0) / (ow - 1.0)
                };
                let x = x + roi.0 * (iw - 1.0);
                return (x, x < 0.0 || x > iw - 1.0);
            }
            "pytorch_half_pixel" if ow == 1.0 => -0.5,
            "half_pixel_symmetric" => {
                let offset = iw / 2.0 * (1.0 - out as f64 / ow);
                offset + (y + 0.5) / scale - 0.5
            }
            _ => (y + 0.5) / scale - 0.5,
        };
        (x, false)
    }
}

/// `x` resized along `axis` to `out` outputs.
fn resize_axis(
    x: &Tensor,
    axis: usize,
    scale: f64,
    out: usize,
    roi: (f64, f64),
    plan: &Plan,
    extrapolate: f64,
) -> Result<Tensor, String> {
    let input = x.shape()[axis];
    let taps = plan.coeffs(0.5, scale).len();
    if out.saturating_mul(taps) > MAX_ENTRIES || input == 0 {
        return Err(format!("resizing an axis of {input} to {out} ({taps} taps) is out of range"));
    }
    let (mut index, mut weight, mut outside) =
        (Vec::with_capacity(out * taps), Vec::with_capacity(out * taps), Vec::new());
    let pad = taps.div_ceil(2) as i64;
    for y in 0..out {
        let (xo, extrapolated) = plan.source(y as f64, scale, input, out, roi);
        outside.push(extrapolated);
        let floor = xo.floor();
        let ratio = if xo == floor { 1.0 } else { xo - floor };
        let mut c = plan.coeffs(ratio, scale);
        // The taps nearest xo, ties to the smaller index (the reference's rule).
        let padded = xo + pad as f64;
        let p = padded.floor();
        let frac = padded - p;
        let offset = if taps.is_multiple_of(2) {
            if frac == 0.0 {
                -(taps as i64 / 2)
            } else {
                -(taps as i64 / 2) + 1
            }
        } else {
            let base = -((taps as i64 - 1) / 2);
            if frac <= 0.5 {
                base
            } else {
                base + 1
            }
        };
        let start = p as i64 + offset - pad;
        let idx: Vec<i64> = (0..taps as i64).map(|k| start + k).collect();
        if plan.exclude_outside {
            for (w, &i) in c.iter_mut().zip(&idx) {
                if i < 0 || i >= input as i64 {
                    *w = 0.0;
                }
            }
            let sum: f64 = c.iter().sum();
            let sum = if sum == 0.0 { 1.0 } else { sum };
            c.iter_mut().for_each(|w| *w /= sum);
        }
        index.extend(idx.iter().map(|&i| i.clamp(0, input as i64 - 1)));
        weight.extend(c);
    }
    let rank = x.rank();
    if plan.mode == "nearest" {
        return Ok(nearest(x, axis, &index, &weight, taps, &outside, extrapolate));
    }
    let at_axis = |n: usize, m: usize| -> Vec<i64> {
        let mut s: Vec<i64> = x.shape().iter().map(|&d| d as i64).collect();
        s[axis] = n as i64;
        s.insert(axis + 1, m as i64);
        s
    };
    let gathered = x.gather(&Tensor::from_vec(index, &[out * taps]), axis as i64).reshape(&at_axis(out, taps));
    let mut wshape = vec![1i64; rank + 1];
    wshape[axis] = out as i64;
    wshape[axis + 1] = taps as i64;
    let w = Tensor::from_vec(weight, &[out * taps]).cast(x.dtype()).reshape(&wshape);
    let y = (&gathered * &w).sum(&[axis as i64 + 1], false);
    if !outside.iter().any(|&o| o) {
        return Ok(y);
    }
    let mut mshape = vec![1i64; rank];
    mshape[axis] = out as i64;
    let mask = Tensor::from_vec(outside, &[out]).reshape(&mshape);
    Ok(Tensor::select(&mask, &Tensor::full(&[], extrapolate, x.dtype()), &y))
}

/// Nearest: a copy of the one tap of weight 1 (none when
/// `exclude_outside` dropped it: 0), never an arithmetic blend, so the
/// input's values (infinities included) come through exactly.
fn nearest(
    x: &Tensor,
    axis: usize,
    index: &[i64],
    weight: &[f64],
    taps: usize,
    outside: &[bool],
    extrapolate: f64,
) -> Tensor {
    let out = outside.len();
    let pick: Vec<Option<i64>> =
        (0..out).map(|y| (0..taps).find(|&k| weight[y * taps + k] != 0.0).map(|k| index[y * taps + k])).collect();
    let idx: Vec<i64> = pick.iter().map(|p| p.unwrap_or(0)).collect();
    let mut y = x.gather(&Tensor::from_vec(idx, &[out]), axis as i64);
    let mut mshape = vec![1i64; x.rank()];
    mshape[axis] = out as i64;
    let fill = |mask: Vec<bool>, value: f64, y: Tensor| -> Tensor {
        let mask = Tensor::from_vec(mask, &[out]).reshape(&mshape);
        Tensor::select(&mask, &Tensor::full(&[], value, x.dtype()), &y)
    };
    if pick.iter().any(Option::is_none) {
        y = fill(pick.iter().map(Option::is_none).collect(), 0.0, y);
    }
    if outside.iter().any(|&o| o) {
        y = fill(outside.to_vec(), extrapolate, y);
    }
    y
}

/// `Resize` and `Upsample`.
pub(crate) fn resize(n: &mut Node) -> OpResult {
    let x = n.input(0)?;
    let (rank, dims) = (x.rank(), x.shape().to_vec());
    if !x.dtype().is_float() {
        return Err(format!("input is {}; the importer resizes floats", x.dtype()));
    }
    // Upsample and Resize-10 take (X, scales); Resize-11 on (X, roi, scales, sizes).
    let old = n.op_type == "Upsample" || n.opset < 11;
    let (scales_at, sizes_at, roi_at) = if old { (1, None, None) } else { (2, Some(3), Some(1)) };
    let axes: Vec<usize> = match n.attr_ints("axes")? {
        Some(a) => a.iter().map(|&a| normalize_axis(a, rank)).collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    let given = |i: Option<usize>| i.and_then(|i| n.opt_input(i)).is_some_and(|t| !t.is_empty());
    let (mut scale, mut out): (Vec<f64>, Vec<usize>) = (vec![1.0; rank], dims.clone());
    if given(sizes_at) {
        let sizes = n.known_i64s(sizes_at.unwrap_or(3))?;
        if sizes.len() != axes.len() || sizes.iter().any(|&s| s < 0) {
            return Err(format!("sizes {sizes:?} must give one size per axis of {axes:?}"));
        }
        for (&a, &s) in axes.iter().zip(&sizes) {
            scale[a] = s as f64 / dims[a].max(1) as f64;
            out[a] = s as usize;
        }
        let policy = n.attr_s("keep_aspect_ratio_policy", "stretch")?;
        if policy != "stretch" {
            let pick = axes.iter().map(|&a| scale[a]);
            let s = if policy == "not_larger" { pick.fold(f64::INFINITY, f64::min) } else { pick.fold(0.0, f64::max) };
            for &a in &axes {
                scale[a] = s;
                out[a] = (s * dims[a] as f64 + 0.5) as usize;
            }
        }
    } else if given(Some(scales_at)) || n.has_attr("scales") {
        // Upsample-7 has its scales as an attribute.
        let scales = match n.attr_floats("scales")? {
            Some(s) => s.iter().map(|&v| v as f64).collect(),
            None => n.known_f64s(scales_at)?,
        };
        if scales.len() != axes.len() || scales.iter().any(|&s| !(s > 0.0 && s.is_finite())) {
            return Err(format!("scales {scales:?} must be one positive scale per axis of {axes:?}"));
        }
        for (&a, &s) in axes.iter().zip(&scales) {
            // The spec's reference rounds the scaled size in f32 arithmetic.
            scale[a] = s as f32 as f64;
            out[a] = (scale[a] * dims[a] as f64) as usize;
        }
    } else {
        return Err("one of scales and sizes must be given".into());
    }
    let mut roi = vec![(0.0, 1.0); rank];
    if roi_at.is_some_and(|i| given(Some(i))) {
        let r = n.known_f64s(roi_at.unwrap_or(1))?;
        if r.len() != 2 * axes.len() {
            return Err(format!("roi {r:?} must hold starts and ends of the {} axes", axes.len()));
        }
        for (i, &a) in axes.iter().enumerate() {
            roi[a] = (r[i], r[axes.len() + i]);
        }
    }
    let default_coord = if old { "asymmetric" } else { "half_pixel" };
    let (mode, coord) = (n.attr_s("mode", "nearest")?, n.attr_s("coordinate_transformation_mode", default_coord)?);
    let nearest = n.attr_s("nearest_mode", if old { "floor" } else { "round_prefer_floor" })?;
    let mode = if mode == "bilinear" || mode == "trilinear" { "linear".to_string() } else { mode };
    if !["nearest", "linear", "cubic"].contains(&mode.as_str()) {
        return Err(format!("mode '{mode}' is not nearest, linear or cubic"));
    }
    let plan = Plan {
        mode: &mode,
        nearest: &nearest,
        coord: &coord,
        antialias: n.attr_i("antialias", 0)? != 0 && mode != "nearest",
        a: n.attr_f("cubic_coeff_a", -0.75)? as f64,
        exclude_outside: n.attr_i("exclude_outside", 0)? != 0,
    };
    let extrapolate = n.attr_f("extrapolation_value", 0.0)? as f64;
    let mut y = x.clone();
    for &a in &axes {
        let identity = (scale[a] - 1.0).abs() < 1e-9 && out[a] == dims[a] && roi[a] == (0.0, 1.0);
        if !identity {
            y = resize_axis(&y, a, scale[a], out[a], roi[a], &plan, extrapolate)?;
        }
    }
    Ok(vec![y])
}

/// The attributes `GridSample` reads.
pub(crate) const GRID_ATTRS: &[&str] = &["align_corners", "mode", "padding_mode"];

/// `x` reflected into `[lo, hi]` by its borders, as ONNX's reference
/// reflects (repeatedly, by the near border first).
fn reflect(x: &Tensor, lo: f64, hi: f64) -> Tensor {
    let rng = hi - lo;
    if rng <= 0.0 {
        return Tensor::full(&[], lo, x.dtype()).broadcast_to(x.shape());
    }
    let (below, above) = (x.lt(lo), x.gt(hi));
    let s = |v: f64| Tensor::full(&[], v, x.dtype());
    let dx = Tensor::select(&below, &(&s(lo) - x), &(x - &s(hi)));
    let n = (&dx / &s(rng)).floor();
    let r = &dx - &(&n * &s(rng));
    let even = n.rem(2.0).eq(0.0);
    let (from_lo, from_hi) = (&s(lo) + &r, &s(hi) - &r);
    let low = Tensor::select(&even, &from_lo, &from_hi);
    let high = Tensor::select(&even, &from_hi, &from_lo);
    Tensor::select(&below, &low, &Tensor::select(&above, &high, x))
}

/// What `GridSample` does along each axis.
struct GridPlan<'a> {
    mode: &'a str,
    padding: &'a str,
    align: bool,
    nb: usize,
    points: usize,
    nd: usize,
}

impl GridPlan<'_> {
    /// Axis `a`'s taps: the grid's coordinate denormalized, clamped or
    /// reflected when outside, then each tap's index as read under the
    /// padding mode and its weight (0 for a tap outside under zeros).
    fn axis_taps(&self, grid: &Tensor, a: usize, len: usize, dtype: DType) -> Vec<(Tensor, Tensor)> {
        let (mode, padding, align, nb, points, nd) =
            (self.mode, self.padding, self.align, self.nb, self.points, self.nd);
        let s = |v: f64| Tensor::full(&[], v, dtype);
        let g =
            grid.cast(dtype).slice_axis(-1, (nd - 1 - a) as i64, (nd - a) as i64).reshape(&[nb as i64, points as i64]);
        let len_f = len as f64;
        let mut v = if align {
            (&(&g + &s(1.0)) / &s(2.0)) * &s(len_f - 1.0)
        } else {
            (&(&(&g + &s(1.0)) * &s(len_f)) - &s(1.0)) / &s(2.0)
        };
        if mode == "nearest" {
            v = v.round();
        }
        let (lo, hi) = if align { (0.0, len_f - 1.0) } else { (-0.5, len_f - 0.5) };
        let outside = v.lt(lo).logical_or(v.gt(hi));
        v = match padding {
            "border" => Tensor::select(&outside, &v.clamp(0.0, len_f - 1.0), &v),
            "reflection" => Tensor::select(&outside, &reflect(&v, lo, hi), &v),
            _ => v,
        };
        // The taps: (integer-valued index, weight).
        let taps: Vec<(Tensor, Tensor)> = match mode {
            // Truncation toward zero, as the reference's int cast.
            "nearest" => {
                vec![(
                    Tensor::select(&v.lt(0.0), &v.neg().floor().neg(), &v.floor()),
                    Tensor::ones(&[nb, points], dtype),
                )]
            }
            "linear" => {
                let x0 = v.floor();
                let t = &v - &x0;
                vec![(x0.clone(), &s(1.0) - &t), (&x0 + &s(1.0), t)]
            }
            _ => {
                let x0 = v.floor();
                let t = &v - &x0;
                let a = -0.75;
                let k = |d: &Tensor| -> Tensor {
                    // Keys' cubic of |d|, d in [0, 2].
                    let d = d.abs();
                    let near = &(&(&(&s(a + 2.0) * &d) - &s(a + 3.0)) * &d) * &d + &s(1.0);
                    let far = &(&(&(&(&s(a) * &d) - &s(5.0 * a)) * &d) + &s(8.0 * a)) * &d - &s(4.0 * a);
                    Tensor::select(&d.le(1.0), &near, &far)
                };
                (-1..=2).map(|o: i64| (&x0 + &s(o as f64), k(&(&t - &s(o as f64))))).collect()
            }
        };
        // Each tap's index as read under the padding mode, and whether it reads 0.
        taps.into_iter()
            .map(|(i, w)| match padding {
                "zeros" => {
                    let valid = i.ge(0.0).logical_and(i.lt(len_f));
                    (i.clamp(0.0, len_f - 1.0), Tensor::select(&valid, &w, &s(0.0)))
                }
                "border" => (i.clamp(0.0, len_f - 1.0), w),
                _ => {
                    let r = reflect(&i, lo, hi);
                    (Tensor::select(&r.lt(0.0), &r.neg().floor().neg(), &r.floor()).clamp(0.0, len_f - 1.0), w)
                }
            })
            .collect()
    }
}

/// `GridSample` (opset 16; N-D from 20): `X` `[N, C, D1.., Dk]` sampled at
/// `grid` `[N, O1.., Om, k]` (normalized coordinates, the last axis in
/// `x, y[, z]` order), nearest, linear or cubic, with zeros, border or
/// reflection padding, as ONNX's reference: the coordinates are
/// denormalized, out-of-range ones clamped or reflected, and each tap
/// (1, 2 or 4 per axis) is one gather of `X` flattened, weighted by the
/// product of its axes' weights; a tap outside reads 0 (zeros), the
/// nearest edge (border) or its reflection.
pub(crate) fn grid_sample(n: &mut Node) -> OpResult {
    let (x, grid) = (n.input(0)?, n.input(1)?);
    let (xs, gs) = (x.shape().to_vec(), grid.shape().to_vec());
    let nd = xs.len().saturating_sub(2);
    if !x.dtype().is_float() || nd == 0 || gs.len() != nd + 2 || gs[0] != xs[0] || gs[nd + 1] != nd {
        return Err(format!("X {xs:?} and grid {gs:?} must be [N, C, D1..Dk] and [N, O1..Ok, k] floats"));
    }
    let (mode, padding) = (n.attr_s("mode", "linear")?, n.attr_s("padding_mode", "zeros")?);
    let mode = match mode.as_str() {
        "bilinear" => "linear".to_string(),
        "bicubic" => "cubic".to_string(),
        _ => mode,
    };
    if !["nearest", "linear", "cubic"].contains(&mode.as_str())
        || !["zeros", "border", "reflection"].contains(&padding.as_str())
    {
        return Err(format!("mode '{mode}' / padding_mode '{padding}' are not supported values"));
    }
    let align = n.attr_i("align_corners", 0)? != 0;
    let dtype = x.dtype();
    let s = |v: f64| Tensor::full(&[], v, dtype);
    let dims = &xs[2..];
    let (nb, c) = (xs[0], xs[1]);
    let points: usize = gs[1..=nd].iter().product();
    // Per spatial axis: the taps (index, weight) of every point, [N, P] each.
    let plan = GridPlan { mode: &mode, padding: &padding, align, nb, points, nd };
    let per_axis: Vec<Vec<(Tensor, Tensor)>> =
        dims.iter().enumerate().map(|(a, &len)| plan.axis_taps(grid, a, len, dtype)).collect();
    // Every combination of taps: one gather of X flattened to [N, C, S].
    let flat = x.reshape(&[nb as i64, c as i64, -1]);
    let strides: Vec<f64> = (0..nd).map(|a| dims[a + 1..].iter().product::<usize>() as f64).collect();
    let combos: usize = per_axis.iter().map(Vec::len).product();
    let mut acc: Option<Tensor> = None;
    for combo in 0..combos {
        let (mut rest, mut index, mut weight) = (combo, None::<Tensor>, None::<Tensor>);
        for (a, taps) in per_axis.iter().enumerate() {
            let (i, w) = &taps[rest % taps.len()];
            rest /= taps.len();
            let term = i * &s(strides[a]);
            index = Some(match index {
                Some(ix) => &ix + &term,
                None => term,
            });
            weight = Some(match weight {
                Some(wt) => &wt * w,
                None => w.clone(),
            });
        }
        let index = index.expect("nd > 0").cast(DType::I64).reshape(&[nb as i64, 1, points as i64]);
        let picked = flat.gather_elements(2, &index.broadcast_to(&[nb, c, points]));
        let term = &picked * &weight.expect("nd > 0").reshape(&[nb as i64, 1, points as i64]);
        acc = Some(match acc {
            Some(sum) => &sum + &term,
            None => term,
        });
    }
    let mut shape = vec![nb as i64, c as i64];
    shape.extend(gs[1..=nd].iter().map(|&d| d as i64));
    Ok(vec![acc.expect("at least one tap").reshape(&shape)])
}
