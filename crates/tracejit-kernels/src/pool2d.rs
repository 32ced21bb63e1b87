//! 2-D max and average pooling of f32 NCHW activations, forward and
//! backward, with ONNX `MaxPool` / `AveragePool` semantics: explicit
//! padding per side (each pad smaller than the kernel), floor mode for the
//! output size (`ceil_mode = 0`), dilation 1.
//!
//! - Max: padding never wins (it is -inf); NaN propagates (a window
//!   holding NaN gives NaN). The backward routes each `dy` to its window's
//!   first maximum in row-major order (PyTorch's scan, `v > max ||
//!   isnan(v)`: ties go to the first, a window with NaN to its last NaN, a
//!   window of -inf to its first value), accumulating where windows
//!   overlap. `dx` is overwritten.
//! - Average: `count_include_pad = false` — the sum over the window's
//!   in-bounds values divided by their count (ONNX's default, TF).
//!
//! How: in general (`general`), per output row the window's input rows are
//! first reduced column by column into a row buffer (the max or the sum,
//! in row order), then each output reduces its window's columns of that
//! buffer; the backward of the average reverses the two steps. The max's
//! two steps are row-wide selects in vector code where the CPU has it
//! (the buffer's padding columns held at -inf and its columns dealt into
//! stride phases, so every output folds its window unclipped; `simd`).
//! The 2x2
//! stride-2 window without padding, the pool of the workloads, has loops
//! of its own (`fast`), without branches, in 512-bit (AVX-512F) or 256-bit
//! (AVX2) code where the CPU has it (`simd`: a vector holds the two
//! columns of 8 or 4 windows of a row, a row's last windows masked), else
//! scalar. All of them give the same bits: each output's operations are
//! the general loops', in their order.
//!
//! The functions take no [`Isa`]: they use the widest vector code of the
//! CPU (`Isa::native`). Planes (image, channel) are independent: large
//! calls split them over the thread pool in chunks fixed by the sizes, so
//! results never depend on the thread count.

use crate::{Isa, Width};
use fast::Pass;

mod channels_last;
mod fast;
mod general;
#[cfg(target_arch = "x86_64")]
mod simd;

pub use channels_last::{avg_forward_channels_last, max_forward_channels_last};
#[cfg(test)]
mod tests;

/// The sizes of a 2-D pooling: `x [batch, channels, in_h, in_w]`, `y
/// [batch, channels, out_h, out_w]`. Pairs are (height, width); `pad` is
/// (top, left, bottom, right).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pool2dGeometry {
    /// Images.
    pub batch: usize,
    /// Channels.
    pub channels: usize,
    /// Input height.
    pub in_h: usize,
    /// Input width.
    pub in_w: usize,
    /// Window (height, width).
    pub kernel: [usize; 2],
    /// Stride (height, width).
    pub stride: [usize; 2],
    /// Padding: top, left, bottom, right (each below the kernel's size on
    /// its axis).
    pub pad: [usize; 4],
}

impl Pool2dGeometry {
    /// Output height: `(in_h + pad top + pad bottom - kernel) / stride + 1`.
    pub fn out_h(&self) -> usize {
        out_size(self.in_h + self.pad[0] + self.pad[2], self.kernel[0], self.stride[0])
    }

    /// Output width.
    pub fn out_w(&self) -> usize {
        out_size(self.in_w + self.pad[1] + self.pad[3], self.kernel[1], self.stride[1])
    }

    /// Checks that the geometry describes a pooling; the error names what
    /// is wrong.
    ///
    /// ```
    /// use tracejit_kernels::pool2d::Pool2dGeometry;
    ///
    /// let mut g = Pool2dGeometry { batch: 1, channels: 3, in_h: 8, in_w: 8,
    ///     kernel: [2, 2], stride: [2, 2], pad: [0, 0, 2, 0] };
    /// assert!(g.validate().unwrap_err().contains("pad bottom 2"));
    /// g.pad = [1, 1, 1, 1];
    /// assert_eq!((g.validate(), g.out_h()), (Ok(()), 5));
    /// ```
    pub fn validate(&self) -> Result<(), String> {
        let g = self;
        let pos = [
            ("channels", g.channels),
            ("in_h", g.in_h),
            ("in_w", g.in_w),
            ("kernel height", g.kernel[0]),
            ("kernel width", g.kernel[1]),
            ("stride height", g.stride[0]),
            ("stride width", g.stride[1]),
        ];
        if let Some((name, _)) = pos.iter().find(|(_, v)| *v == 0) {
            return Err(format!("pool2d: {name} is 0"));
        }
        for (i, side) in ["top", "left", "bottom", "right"].iter().enumerate() {
            let k = g.kernel[i % 2];
            if g.pad[i] >= k {
                return Err(format!("pool2d: pad {side} {} must be smaller than the kernel's {k}", g.pad[i]));
            }
        }
        for (axis, i) in [("height", 0), ("width", 1)] {
            let n = [g.in_h, g.in_w][i] + g.pad[i] + g.pad[i + 2];
            if n < g.kernel[i] {
                return Err(format!("pool2d: the kernel {axis} {} exceeds the padded input {axis} {n}", g.kernel[i]));
            }
        }
        let sizes = [g.batch, g.channels, g.in_h, g.in_w];
        if sizes.iter().try_fold(1usize, |a, &b| a.checked_mul(b.max(1))).is_none_or(|v| v > isize::MAX as usize / 8) {
            return Err("pool2d: tensor sizes overflow".into());
        }
        Ok(())
    }

    /// Values of `x` (and `dx`).
    fn x_len(&self) -> usize {
        self.batch * self.channels * self.in_h * self.in_w
    }

    /// Values of `y` (and `dy`).
    fn y_len(&self) -> usize {
        self.batch * self.channels * self.out_h() * self.out_w()
    }

    /// The in-bounds input range of the window of output `o` on `axis`.
    fn window(&self, axis: usize, o: usize) -> std::ops::Range<usize> {
        let n = [self.in_h, self.in_w][axis];
        let start = (o * self.stride[axis]) as isize - self.pad[axis] as isize;
        let end = (start + self.kernel[axis] as isize).min(n as isize);
        start.max(0) as usize..end.max(0) as usize
    }

    /// Whether this is the 2x2 stride-2 pool without padding of [`fast`].
    fn is_2x2(&self) -> bool {
        self.kernel == [2, 2] && self.stride == [2, 2] && self.pad == [0; 4]
    }

    /// Panics (naming `func`) unless the geometry is valid and the slices
    /// have its lengths.
    fn check(&self, func: &str, lens: &[(&str, usize, bool)]) {
        if let Err(e) = self.validate() {
            panic!("pool2d::{func}: {e}");
        }
        for &(name, len, input_side) in lens {
            let want = if input_side { self.x_len() } else { self.y_len() };
            assert!(len == want, "pool2d::{func}: {name} holds {len} values, the geometry needs {want}");
        }
    }
}

/// Floor-mode output size; 0 when the window does not fit.
fn out_size(padded: usize, kernel: usize, stride: usize) -> usize {
    match padded.checked_sub(kernel) {
        Some(room) if stride > 0 && kernel > 0 => room / stride + 1,
        _ => 0,
    }
}

/// PyTorch's max update: `v` replaces `m` when greater or NaN (so NaN
/// sticks, and ties keep the first).
#[inline(always)]
fn takes(v: f32, m: f32) -> bool {
    v > m || v.is_nan()
}

/// Runs `f(p, out plane p)` for every plane `p` (image, channel) of
/// `out`, planes of `len` values, in chunks over the pool when the call
/// is large (`values`: the values it reads and writes).
fn each_plane(g: &Pool2dGeometry, out: &mut [f32], len: usize, values: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
    each_part(g.batch * g.channels, out, len, values, f)
}

/// [`each_plane`] over any `count` parts of `len` values each.
fn each_part(count: usize, out: &mut [f32], len: usize, values: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
    if count == 0 || len == 0 {
        return;
    }
    let chunks = ((values as u64 / crate::threads::split_threshold()) as usize).clamp(1, 64).min(count);
    let per = count.div_ceil(chunks);
    let chunks = count.div_ceil(per);
    let run = |c: usize, out: &mut [f32]| {
        for (i, plane) in out.chunks_exact_mut(len).enumerate() {
            f(c * per + i, plane);
        }
    };
    if chunks > 1 {
        if let Some(pool) = crate::threads::pool() {
            let ptr = SendPtr(out.as_mut_ptr());
            pool.run(chunks, &|c| {
                let n = per.min(count - c * per);
                // SAFETY: chunk `c`'s planes, written by this task only;
                // `out` outlives the run.
                let mine = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(c * per * len), n * len) };
                run(c, mine);
            });
            return;
        }
    }
    for (c, mine) in out.chunks_mut(per * len).enumerate() {
        run(c, mine);
    }
}

/// A pointer shared with the pool's tasks (each writes its own planes).
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: tasks write disjoint planes while the caller waits.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer (a method, so closures capture the wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Which loops a pass runs (the tests force the other routes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum Route {
    /// The 2x2 stride-2 loops where they apply, in the widest vector code
    /// the caller's `Isa` allows on this CPU; else the general loops.
    Auto(Isa),
    /// The general loops ([`general`]).
    General,
    /// The 2x2 loops ([`fast`]) at this vector width (`None`: scalar); the
    /// CPU must have it and the geometry be a 2x2 stride-2 pool.
    Fast(Option<Width>),
}

impl Route {
    /// The vector width of the general loops' vector steps: the widest the
    /// caller's `Isa` allows on this CPU (`Auto`), else scalar.
    fn width(self) -> Option<Width> {
        match self {
            Route::Auto(isa) => isa.width(),
            Route::General | Route::Fast(_) => None,
        }
    }

    /// The 2x2 loops' width if `g` takes them: `Some(width)`.
    fn fast(self, g: &Pool2dGeometry) -> Option<Option<Width>> {
        match self {
            Route::Auto(isa) if g.is_2x2() => Some(isa.width()),
            Route::Fast(w) => {
                assert!(g.is_2x2(), "pool2d: the 2x2 loops forced on {g:?}");
                Some(w)
            }
            _ => None,
        }
    }
}

/// `y` = the maximum of each window (NaN if it holds NaN); overwritten.
///
/// ```
/// use tracejit_kernels::pool2d::{max_forward, Pool2dGeometry};
/// use tracejit_kernels::Isa;
///
/// let g = Pool2dGeometry { batch: 1, channels: 1, in_h: 2, in_w: 3,
///     kernel: [2, 2], stride: [1, 1], pad: [0, 0, 0, 1] };
/// let mut y = [0.0; 3];
/// max_forward(&g, &[1.0, 5.0, -2.0, 3.0, 4.0, -1.0], &mut y, Isa::native());
/// assert_eq!(y, [5.0, 5.0, -1.0]); // the padding (-inf) never wins
/// ```
///
/// # Panics
/// If the geometry is invalid or a slice's length does not match it.
pub fn max_forward(g: &Pool2dGeometry, x: &[f32], y: &mut [f32], isa: Isa) {
    max_forward_on(Route::Auto(isa), g, x, y)
}

/// [`max_forward`] on a given route.
pub(crate) fn max_forward_on(route: Route, g: &Pool2dGeometry, x: &[f32], y: &mut [f32]) {
    g.check("max_forward", &[("x", x.len(), true), ("y", y.len(), false)]);
    let fast = route.fast(g);
    let (xp, yp) = (g.in_h * g.in_w, g.out_h() * g.out_w());
    let values = x.len() + y.len();
    each_plane(g, y, yp, values, &|p, y| {
        let x = &x[p * xp..][..xp];
        match fast {
            Some(w) => fast::plane(w, Pass::Max, g, x, &[], y),
            None => general::max_plane(route.width(), g, x, y),
        }
    });
}

/// `dx` (overwritten): each `dy` added at its window's first maximum in
/// row-major order (see the module), accumulating where windows overlap.
///
/// ```
/// use tracejit_kernels::pool2d::{max_backward, Pool2dGeometry};
/// use tracejit_kernels::Isa;
///
/// let g = Pool2dGeometry { batch: 1, channels: 1, in_h: 2, in_w: 3,
///     kernel: [2, 2], stride: [1, 1], pad: [0; 4] };
/// let mut dx = [0.0; 6];
/// max_backward(&g, &[7.0, 7.0, 1.0, 2.0, 3.0, 7.0], &[1.0, 10.0], &mut dx, Isa::native());
/// assert_eq!(dx, [1.0, 10.0, 0.0, 0.0, 0.0, 0.0]); // ties: the first
/// ```
///
/// # Panics
/// If the geometry is invalid or a slice's length does not match it.
pub fn max_backward(g: &Pool2dGeometry, x: &[f32], dy: &[f32], dx: &mut [f32], isa: Isa) {
    max_backward_on(Route::Auto(isa), g, x, dy, dx)
}

/// [`max_backward`] on a given route.
pub(crate) fn max_backward_on(route: Route, g: &Pool2dGeometry, x: &[f32], dy: &[f32], dx: &mut [f32]) {
    g.check("max_backward", &[("x", x.len(), true), ("dy", dy.len(), false), ("dx", dx.len(), true)]);
    let fast = route.fast(g);
    let (xp, yp) = (g.in_h * g.in_w, g.out_h() * g.out_w());
    each_plane(g, dx, xp, 2 * x.len() + dy.len(), &|p, dx| {
        let (x, dy) = (&x[p * xp..][..xp], &dy[p * yp..][..yp]);
        match fast {
            Some(w) => fast::plane(w, Pass::MaxBack, g, x, dy, dx),
            None => general::max_backward_plane(g, x, dy, dx),
        }
    });
}

/// `y` = the mean of each window's in-bounds values; overwritten.
///
/// ```
/// use tracejit_kernels::pool2d::{avg_forward, Pool2dGeometry};
/// use tracejit_kernels::Isa;
///
/// let g = Pool2dGeometry { batch: 1, channels: 1, in_h: 1, in_w: 3,
///     kernel: [1, 2], stride: [1, 2], pad: [0, 1, 0, 0] };
/// let mut y = [0.0; 2];
/// avg_forward(&g, &[4.0, 1.0, 2.0], &mut y, Isa::native());
/// assert_eq!(y, [4.0, 1.5]); // the padding is not counted
/// ```
///
/// # Panics
/// If the geometry is invalid or a slice's length does not match it.
pub fn avg_forward(g: &Pool2dGeometry, x: &[f32], y: &mut [f32], isa: Isa) {
    avg_forward_on(Route::Auto(isa), g, x, y)
}

/// [`avg_forward`] on a given route.
pub(crate) fn avg_forward_on(route: Route, g: &Pool2dGeometry, x: &[f32], y: &mut [f32]) {
    g.check("avg_forward", &[("x", x.len(), true), ("y", y.len(), false)]);
    let fast = route.fast(g);
    let (xp, yp) = (g.in_h * g.in_w, g.out_h() * g.out_w());
    let values = x.len() + y.len();
    each_plane(g, y, yp, values, &|p, y| {
        let x = &x[p * xp..][..xp];
        match fast {
            Some(w) => fast::plane(w, Pass::Avg, g, x, &[], y),
            None => general::avg_plane(g, x, y),
        }
    });
}

/// `dx` (overwritten): each `dy` divided by its window's in-bounds count
/// and added to those values.
///
/// ```
/// use tracejit_kernels::pool2d::{avg_backward, Pool2dGeometry};
/// use tracejit_kernels::Isa;
///
/// let g = Pool2dGeometry { batch: 1, channels: 1, in_h: 1, in_w: 3,
///     kernel: [1, 2], stride: [1, 1], pad: [0; 4] };
/// let mut dx = [0.0; 3];
/// avg_backward(&g, &[2.0, 4.0], &mut dx, Isa::native());
/// assert_eq!(dx, [1.0, 3.0, 2.0]);
/// ```
///
/// # Panics
/// If the geometry is invalid or a slice's length does not match it.
pub fn avg_backward(g: &Pool2dGeometry, dy: &[f32], dx: &mut [f32], isa: Isa) {
    avg_backward_on(Route::Auto(isa), g, dy, dx)
}

/// [`avg_backward`] on a given route.
pub(crate) fn avg_backward_on(route: Route, g: &Pool2dGeometry, dy: &[f32], dx: &mut [f32]) {
    g.check("avg_backward", &[("dy", dy.len(), false), ("dx", dx.len(), true)]);
    let fast = route.fast(g);
    let (xp, yp) = (g.in_h * g.in_w, g.out_h() * g.out_w());
    let values = dx.len() + dy.len();
    each_plane(g, dx, xp, values, &|p, dx| {
        let dy = &dy[p * yp..][..yp];
        match fast {
            Some(w) => fast::plane(w, Pass::AvgBack, g, dy, &[], dx),
            None => general::avg_backward_plane(g, dy, dx),
        }
    });
}
