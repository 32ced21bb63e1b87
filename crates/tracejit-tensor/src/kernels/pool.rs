//! Reference 2-D pooling: max and average, forward and backward, as plain
//! loops over f32 or f64 NCHW tensors (the oracle of the fast kernels in
//! `tracejit-kernels`). See [`crate::spatial`] for the semantics.
//!
//! Each window is scanned in row-major order over its in-bounds values
//! only (padding is never read): the max keeps the first of equal values
//! and takes a NaN over anything (PyTorch's `v > max || isnan(v)`, so a
//! window holding NaN answers NaN and routes its gradient to its last
//! NaN); the average sums in that order and divides by the count of
//! in-bounds values (ONNX `count_include_pad = 0`).

use std::ops::Range;

use super::num::Num;
use crate::spatial::Pool2dAttrs;
use crate::{DType, Storage, StorageElement};

/// The sizes of one pooling, read from its input.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    planes: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    attrs: Pool2dAttrs,
}

impl Geometry {
    fn new(name: &str, attrs: Pool2dAttrs, x: &[usize]) -> Geometry {
        assert!(x.len() == 4, "{name}: the input {x:?} must be of rank 4");
        if let Some(p) = attrs.problem() {
            panic!("{name}: {p}");
        }
        let (Some(oh), Some(ow)) = (attrs.out_size(0, x[2]), attrs.out_size(1, x[3])) else {
            panic!("{name}: the window {:?} does not fit the padded input {x:?}", attrs.kernel);
        };
        Geometry { planes: x[0] * x[1], h: x[2], w: x[3], oh, ow, attrs }
    }

    /// The in-bounds input rows (axis 0) or columns (axis 1) of output
    /// `o`'s window.
    fn window(&self, axis: usize, o: usize) -> Range<usize> {
        let a = &self.attrs;
        let start = (o * a.stride[axis]) as isize - a.pad[axis] as isize;
        let end = (start + a.kernel[axis] as isize).min([self.h, self.w][axis] as isize);
        start.max(0) as usize..end.max(0) as usize
    }
}

/// PyTorch's max-pool update rule: `v` replaces the running maximum `m`
/// when it is larger or NaN.
fn takes<T: Num>(v: T, m: T) -> bool {
    v > m || v.is_nan_value()
}

fn values<T: StorageElement>(name: &str, s: &Storage) -> Vec<T> {
    s.to_vec::<T>().unwrap_or_else(|_| panic!("{name}: operands must share one float dtype, got {}", s.dtype()))
}

fn wrap<T: StorageElement>(v: Vec<T>, shape: &[usize]) -> Storage {
    Storage::from_vec(v, shape).expect("sizes computed from the geometry")
}

/// Runs `f::<f32>` or `f::<f64>` by `dtype`.
macro_rules! by_float {
    ($name:expr, $dtype:expr, $f:ident ( $($arg:expr),* )) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            d => panic!("{}: takes f32 or f64, got {d}", $name),
        }
    };
}

/// The index (within its plane) of the window's maximum, by [`takes`];
/// the window's first value when every value is -inf. `None` for an
/// empty window.
fn argmax<T: PoolFloat>(g: &Geometry, x: &[T], oy: usize, ox: usize) -> Option<usize> {
    let (rows, cols) = (g.window(0, oy), g.window(1, ox));
    if rows.is_empty() || cols.is_empty() {
        return None;
    }
    let (mut m, mut at) = (T::MINUS_INFINITY, rows.start * g.w + cols.start);
    for iy in rows {
        for ix in cols.clone() {
            let v = x[iy * g.w + ix];
            if takes(v, m) {
                (m, at) = (v, iy * g.w + ix);
            }
        }
    }
    Some(at)
}

/// What pooling needs of a float type beyond [`Num`].
trait PoolFloat: Num {
    /// -inf, the max's start (padding, which never wins).
    const MINUS_INFINITY: Self;
    /// A window's count of values.
    fn from_count(n: usize) -> Self;
}

impl PoolFloat for f32 {
    const MINUS_INFINITY: f32 = f32::NEG_INFINITY;
    fn from_count(n: usize) -> f32 {
        n as f32
    }
}

impl PoolFloat for f64 {
    const MINUS_INFINITY: f64 = f64::NEG_INFINITY;
    fn from_count(n: usize) -> f64 {
        n as f64
    }
}

/// Each window's maximum (padding never wins).
pub(crate) fn max_forward(attrs: Pool2dAttrs, x: &Storage) -> Storage {
    let g = Geometry::new("max_pool2d", attrs, x.shape());
    by_float!("max_pool2d", x.dtype(), max_forward_t(&g, x))
}

fn max_forward_t<T: PoolFloat>(g: &Geometry, x: &Storage) -> Storage {
    let xv = values::<T>("max_pool2d", x);
    let mut y = Vec::with_capacity(g.planes * g.oh * g.ow);
    for p in 0..g.planes {
        let plane = &xv[p * g.h * g.w..][..g.h * g.w];
        for oy in 0..g.oh {
            for ox in 0..g.ow {
                y.push(argmax(g, plane, oy, ox).map_or(T::MINUS_INFINITY, |i| plane[i]));
            }
        }
    }
    wrap(y, &[x.shape()[0], x.shape()[1], g.oh, g.ow])
}

/// `dx`: each `dy` added at its window's first maximum.
pub(crate) fn max_backward(attrs: Pool2dAttrs, x: &Storage, dy: &Storage) -> Storage {
    let g = Geometry::new("max_pool2d_backward", attrs, x.shape());
    let want = [x.shape()[0], x.shape()[1], g.oh, g.ow];
    assert!(dy.shape() == want, "max_pool2d_backward: dy {:?} must be {want:?}", dy.shape());
    by_float!("max_pool2d_backward", x.dtype(), max_backward_t(&g, x, dy))
}

fn max_backward_t<T: PoolFloat>(g: &Geometry, x: &Storage, dy: &Storage) -> Storage {
    let (xv, dyv) = (values::<T>("max_pool2d_backward", x), values::<T>("max_pool2d_backward", dy));
    let mut dx = vec![T::ZERO; xv.len()];
    for p in 0..g.planes {
        let plane = &xv[p * g.h * g.w..][..g.h * g.w];
        for oy in 0..g.oh {
            for ox in 0..g.ow {
                if let Some(i) = argmax(g, plane, oy, ox) {
                    let d = &mut dx[p * g.h * g.w + i];
                    *d = d.plus(dyv[(p * g.oh + oy) * g.ow + ox]);
                }
            }
        }
    }
    wrap(dx, x.shape())
}

/// Each window's mean over its in-bounds values.
pub(crate) fn avg_forward(attrs: Pool2dAttrs, x: &Storage) -> Storage {
    let g = Geometry::new("avg_pool2d", attrs, x.shape());
    by_float!("avg_pool2d", x.dtype(), avg_forward_t(&g, x))
}

/// How many in-bounds values a window holds, as `T`.
fn count<T: PoolFloat>(g: &Geometry, oy: usize, ox: usize) -> T {
    T::from_count(g.window(0, oy).len() * g.window(1, ox).len())
}

fn avg_forward_t<T: PoolFloat>(g: &Geometry, x: &Storage) -> Storage {
    let xv = values::<T>("avg_pool2d", x);
    let mut y = Vec::with_capacity(g.planes * g.oh * g.ow);
    for p in 0..g.planes {
        let plane = &xv[p * g.h * g.w..][..g.h * g.w];
        for oy in 0..g.oh {
            for ox in 0..g.ow {
                let mut acc = T::ZERO;
                for iy in g.window(0, oy) {
                    for ix in g.window(1, ox) {
                        acc = acc.plus(plane[iy * g.w + ix]);
                    }
                }
                y.push(acc.divide(count(g, oy, ox)));
            }
        }
    }
    wrap(y, &[x.shape()[0], x.shape()[1], g.oh, g.ow])
}

/// `dx [N, C, input_hw]`: each `dy` divided by its window's count and
/// added to the window's in-bounds values.
pub(crate) fn avg_backward(attrs: Pool2dAttrs, input_hw: [usize; 2], dy: &Storage) -> Storage {
    let d = dy.shape();
    assert!(d.len() == 4, "avg_pool2d_backward: dy {d:?} must be of rank 4");
    let x_shape = [d[0], d[1], input_hw[0], input_hw[1]];
    let g = Geometry::new("avg_pool2d_backward", attrs, &x_shape);
    assert!(
        [g.oh, g.ow] == [d[2], d[3]],
        "avg_pool2d_backward: dy {d:?} is not the pooling of an input of {input_hw:?}"
    );
    by_float!("avg_pool2d_backward", dy.dtype(), avg_backward_t(&g, dy, &x_shape))
}

fn avg_backward_t<T: PoolFloat>(g: &Geometry, dy: &Storage, x_shape: &[usize]) -> Storage {
    let dyv = values::<T>("avg_pool2d_backward", dy);
    let mut dx = vec![T::ZERO; g.planes * g.h * g.w];
    for p in 0..g.planes {
        for oy in 0..g.oh {
            for ox in 0..g.ow {
                let share = dyv[(p * g.oh + oy) * g.ow + ox].divide(count(g, oy, ox));
                for iy in g.window(0, oy) {
                    for ix in g.window(1, ox) {
                        let d = &mut dx[(p * g.h + iy) * g.w + ix];
                        *d = d.plus(share);
                    }
                }
            }
        }
    }
    wrap(dx, x_shape)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{t, v};
    use super::*;

    fn attrs(k: usize, s: usize, p: usize) -> Pool2dAttrs {
        Pool2dAttrs { kernel: [k; 2], stride: [s; 2], pad: [p; 4] }
    }

    #[test]
    fn max_pool_ignores_padding_and_routes_ties_to_the_first() {
        let x = t(vec![1.0f32, 3.0, 3.0, -2.0], &[1, 1, 2, 2]);
        let y = max_forward(attrs(2, 1, 1), &x);
        assert_eq!(v::<f32>(&y), vec![1.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, -2.0]);
        let dy = t(vec![1.0f32; 9], &[1, 1, 3, 3]);
        let dx = max_backward(attrs(2, 1, 1), &x, &dy);
        // The 3.0 at index 1 is first in row-major order in every window
        // holding both 3.0s.
        assert_eq!(v::<f32>(&dx), vec![1.0, 4.0, 3.0, 1.0]);
    }

    #[test]
    fn max_pool_propagates_nan_and_routes_to_the_last_nan() {
        let x = t(vec![f64::NAN, 5.0, f64::NAN, 1.0], &[1, 1, 2, 2]);
        let y = max_forward(attrs(2, 2, 0), &x);
        assert!(v::<f64>(&y)[0].is_nan());
        let dx = max_backward(attrs(2, 2, 0), &x, &t(vec![1.0f64], &[1, 1, 1, 1]));
        assert_eq!(v::<f64>(&dx), vec![0.0, 0.0, 1.0, 0.0]);
    }

    #[test]
    fn avg_pool_leaves_padding_out_of_the_count() {
        // ONNX AveragePool's pads example, count_include_pad = 0: 3x3
        // windows with pads 1 over 1..=9 give corner means of 4 values.
        let x = t((1..=9).map(|i| i as f32).collect(), &[1, 1, 3, 3]);
        let y = avg_forward(attrs(3, 1, 1), &x);
        assert_eq!(v::<f32>(&y), vec![3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0]);
        let dx = avg_backward(attrs(3, 1, 1), [3, 3], &t(vec![12.0f32; 9], &[1, 1, 3, 3]));
        // The corner is in 4 windows: 3 of 4 values, 6 of 6... (12/4 +
        // 12/6 + 12/6 + 12/9).
        assert_eq!(v::<f32>(&dx)[0], 3.0 + 2.0 + 2.0 + 12.0 / 9.0);
    }
}
