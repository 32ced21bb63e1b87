//! The native backward of `layer_norm` (`tracejit.nn.layer_norm_grad`),
//! f32 and f64: per row, the statistics, the two sums the closed form
//! needs and `dx`, while the row sits in L1; `dgamma` and `dbeta` are
//! column sums over the rows.
//!
//! Why a kernel: written with tensor ops, the closed form reads `x` and the
//! cotangent several times (statistics, then the sums, then `dx`, then the
//! column sums), in three or more fused regions. Here every element of `x`
//! and of the cotangent is read from memory once and `dx` written once.
//!
//! Determinism: the column sums run over fixed blocks of [`BLOCK`] rows
//! (each block summed in row order, the blocks' partials then added in
//! block order), so the result depends on the shape only, never on timing
//! or on the thread count: large calls run the blocks over the pool
//! (`tracejit_kernels::threads`), each block into its own partials.
//! Blocks also keep the f32 column sums accurate over many rows.

use std::sync::Mutex;

use std::mem::MaybeUninit;
use std::ops::{Add, AddAssign, Div, Mul, Sub};

use tracejit_tensor::{DType, Storage, StorageElement};
use tracejit_trace::TensorSpec;

/// Rows per block of the column sums.
const BLOCK: usize = 64;

/// Least values of `x` before the blocks go to the pool: a dispatch costs
/// a few µs, a block of 64 rows of 256 about 10.
const PARALLEL_VALUES: usize = 1 << 16;

/// `[x, gamma, beta, eps, dy]`, all f32 or all f64: `x` of rank >= 1, `dy`
/// of `x`'s shape, `eps` a scalar, and `gamma` and `beta` of known dims
/// that broadcast along the last axis only (all 1 but the last, which is 1
/// or `x`'s last dim; rank 0 too, never above `x`'s rank).
pub(super) fn accepts(s: &[TensorSpec]) -> bool {
    if s.len() != 5 {
        return false;
    }
    let dtype = s[0].dtype();
    if !matches!(dtype, DType::F32 | DType::F64) || s.iter().any(|t| t.dtype() != dtype) {
        return false;
    }
    let (x, dy) = (s[0].dims(), s[4].dims());
    let fits = |a: Option<usize>, b: Option<usize>| a.is_none() || b.is_none() || a == b;
    if x.is_empty() || !s[3].dims().is_empty() || dy.len() != x.len() || !x.iter().zip(dy).all(|(&a, &b)| fits(a, b)) {
        return false;
    }
    let last = x[x.len() - 1];
    s[1..3].iter().all(|p| {
        let d = p.dims();
        d.len() <= x.len()
            && match d.split_last() {
                None => true,
                Some((&l, lead)) => {
                    lead.iter().all(|&v| v == Some(1)) && (l == Some(1) || (l.is_some() && fits(l, last)))
                }
            }
    })
}

/// The float types the kernel runs in.
trait Real:
    StorageElement + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self> + AddAssign
{
    const ZERO: Self;
    const ONE: Self;
    fn sqrt(self) -> Self;
    fn from_len(n: usize) -> Self;
}

macro_rules! real {
    ($t:ty) => {
        impl Real for $t {
            const ZERO: $t = 0.0;
            const ONE: $t = 1.0;
            fn sqrt(self) -> $t {
                <$t>::sqrt(self)
            }
            fn from_len(n: usize) -> $t {
                n as $t
            }
        }
    };
}
real!(f32);
real!(f64);

/// `(dx, dgamma, dbeta)` of `layer_norm(x, gamma, beta, eps)` for the
/// cotangent `dy`, with the dtypes and shapes of `x`, `gamma` and `beta`.
pub(super) fn layer_norm_grad(inputs: &[Storage]) -> Vec<Storage> {
    match inputs[0].dtype() {
        DType::F32 => run::<f32>(inputs),
        DType::F64 => run::<f64>(inputs),
        other => panic!("layer_norm_grad: the kernel takes f32 or f64, got x of {other}"),
    }
}

/// A contiguous copy-or-view of an argument's data and its shape.
fn data<'a, T: Real>(s: &'a Storage, what: &str) -> (Vec<usize>, std::borrow::Cow<'a, [T]>) {
    let a = s.array::<T>().unwrap_or_else(|| panic!("layer_norm_grad: {what} is {}, expected {}", s.dtype(), T::DTYPE));
    let shape = a.shape().to_vec();
    match a.as_slice() {
        Some(slice) => (shape, std::borrow::Cow::Borrowed(slice)),
        None => (shape, std::borrow::Cow::Owned(s.to_vec::<T>().expect("the dtype was checked"))),
    }
}

fn storage<T: Real>(v: Vec<T>, shape: &[usize]) -> Storage {
    Storage::from_vec(v, shape).expect("kernel output size")
}

fn run<T: Real>(inputs: &[Storage]) -> Vec<Storage> {
    let (shape, x) = data::<T>(&inputs[0], "x");
    let (gamma_shape, gamma) = data::<T>(&inputs[1], "gamma");
    let beta_shape = inputs[2].shape().to_vec();
    let (_, eps) = data::<T>(&inputs[3], "eps");
    let (dy_shape, dy) = data::<T>(&inputs[4], "the cotangent dy");
    assert_eq!(shape, dy_shape, "layer_norm_grad: the cotangent dy has shape {dy_shape:?}, x {shape:?}");
    let n = *shape.last().expect("the predicate accepts rank >= 1");
    let beta_len: usize = beta_shape.iter().product();
    for (what, len, s) in [("gamma", gamma.len(), &gamma_shape), ("beta", beta_len, &beta_shape)] {
        assert!(
            len == n || len == 1,
            "layer_norm_grad: {what} of shape {s:?} does not broadcast along x's last axis {n}"
        );
    }
    // gamma along the row (a broadcast scalar repeated).
    let gamma_row: std::borrow::Cow<'_, [T]> =
        if gamma.len() == n { std::borrow::Cow::Borrowed(&gamma[..]) } else { vec![gamma[0]; n].into() };
    // dx is written once, element by element: no zeroing pass over it
    // first (at W4's size, 4 MiB of stores the kernel would otherwise make).
    let mut dx: Vec<T> = Vec::with_capacity(x.len());
    let (mut dgamma, mut dbeta) = (vec![T::ZERO; n], vec![T::ZERO; n]);
    let mut out = Out { dx: &mut dx.spare_capacity_mut()[..x.len()], dgamma: &mut dgamma, dbeta: &mut dbeta };
    run_rows(&x, &dy, &gamma_row, eps[0], &mut out);
    // SAFETY: `rows` wrote every element of `dx`'s first `x.len()` slots:
    // each row of `n` elements in turn (and there are none when n is 0).
    unsafe { dx.set_len(x.len()) };
    finish(dx, dgamma, dbeta, &shape, &gamma_shape, &beta_shape)
}

/// [`rows`], the blocks in their AVX2 build when the CPU has AVX2.
fn run_rows<T: Real>(x: &[T], dy: &[T], gamma: &[T], eps: T, out: &mut Out<'_, T>) {
    #[cfg(target_arch = "x86_64")]
    let avx2 = std::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    let avx2 = false;
    rows(x, dy, gamma, eps, out, avx2)
}

/// The outputs the rows write: `dx` (every element, once), and the column
/// sums (added to).
struct Out<'a, T> {
    dx: &'a mut [MaybeUninit<T>],
    dgamma: &'a mut [T],
    dbeta: &'a mut [T],
}

/// One block's operands and outputs: its rows of `x`, `dy` and `dx`, and
/// its partial column sums (`dgamma`'s then `dbeta`'s).
struct Block<'a, T> {
    x: &'a [T],
    dy: &'a [T],
    dx: &'a mut [MaybeUninit<T>],
    partial: &'a mut [T],
}

/// Every row, and the column sums over fixed blocks of [`BLOCK`] rows (on
/// the pool when large), each block in the AVX2 build when `avx2` (which
/// the caller checked the CPU has).
fn rows<T: Real>(x: &[T], dy: &[T], gamma: &[T], eps: T, out: &mut Out<'_, T>, avx2: bool) {
    let n = gamma.len();
    if n == 0 {
        return;
    }
    let mut partial = vec![T::ZERO; x.len().div_ceil(BLOCK * n) * 2 * n];
    let span = BLOCK * n;
    let blocks: Vec<Mutex<Block<'_, T>>> = x
        .chunks(span)
        .zip(dy.chunks(span))
        .zip(out.dx.chunks_mut(span))
        .zip(partial.chunks_mut(2 * n))
        .map(|(((x, dy), dx), partial)| Mutex::new(Block { x, dy, dx, partial }))
        .collect();
    let task = |b: usize| {
        let mut guard = blocks[b].lock().unwrap_or_else(|p| p.into_inner());
        let Block { x, dy, dx, partial } = &mut *guard;
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: the caller checked that the CPU has AVX2.
            return unsafe { block_avx2(x, dy, gamma, eps, dx, partial) };
        }
        block(x, dy, gamma, eps, dx, partial)
    };
    let pool = (x.len() >= PARALLEL_VALUES && blocks.len() > 1).then(tracejit_kernels::threads::pool).flatten();
    match pool {
        Some(pool) => pool.run(blocks.len(), &task),
        None => (0..blocks.len()).for_each(task),
    }
    drop(blocks);
    for part in partial.chunks_exact(2 * n) {
        let (bg, bb) = part.split_at(n);
        for (t, &v) in out.dgamma.iter_mut().zip(bg) {
            *t += v;
        }
        for (t, &v) in out.dbeta.iter_mut().zip(bb) {
            *t += v;
        }
    }
}

/// [`block`] compiled for AVX2 (256-bit vectors: 8 f32 or 4 f64 per
/// instruction; no FMA, so the same rounding as [`block`]).
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block_avx2<T: Real>(x: &[T], dy: &[T], gamma: &[T], eps: T, dx: &mut [MaybeUninit<T>], partial: &mut [T]) {
    block(x, dy, gamma, eps, dx, partial)
}

/// One block's rows, their column sums into `partial` (zero on entry).
#[inline(always)]
fn block<T: Real>(x: &[T], dy: &[T], gamma: &[T], eps: T, dx: &mut [MaybeUninit<T>], partial: &mut [T]) {
    let n = gamma.len();
    let (bg, bb) = partial.split_at_mut(n);
    for ((xr, dyr), dxr) in x.chunks_exact(n).zip(dy.chunks_exact(n)).zip(dx.chunks_exact_mut(n)) {
        row(xr, dyr, gamma, eps, dxr, bg, bb);
    }
}

/// The three results, `dgamma` and `dbeta` summed to one value where the
/// parameter was a broadcast scalar.
fn finish<T: Real>(
    dx: Vec<T>,
    dgamma: Vec<T>,
    dbeta: Vec<T>,
    shape: &[usize],
    gamma_shape: &[usize],
    beta_shape: &[usize],
) -> Vec<Storage> {
    let n = dgamma.len();
    let to_param = |cols: Vec<T>, s: &[usize]| if s.iter().product::<usize>() == n { cols } else { vec![sum(&cols)] };
    vec![
        storage(dx, shape),
        storage(to_param(dgamma, gamma_shape), gamma_shape),
        storage(to_param(dbeta, beta_shape), beta_shape),
    ]
}

/// One row: with `xhat = (x - mean) * rstd` and `dxhat = dy * gamma`,
/// `dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))`; adds
/// `dy * xhat` to `dgamma` and `dy` to `dbeta` (per column). `gamma` has
/// the row's length. Each pass runs over whole chunks of [`LANES`] (a
/// fixed trip count, several vectors of independent partial sums), then
/// the tail.
#[inline(always)]
fn row<T: Real>(x: &[T], dy: &[T], gamma: &[T], eps: T, dx: &mut [MaybeUninit<T>], dgamma: &mut [T], dbeta: &mut [T]) {
    let n = x.len();
    let whole = n - n % LANES;
    let inv_n = T::ONE / T::from_len(n);
    let mean = sum(x) * inv_n;
    let mut acc = [T::ZERO; LANES];
    for c in x[..whole].chunks_exact(LANES) {
        for k in 0..LANES {
            let d = c[k] - mean;
            acc[k] += d * d;
        }
    }
    for (k, &v) in x[whole..].iter().enumerate() {
        let d = v - mean;
        acc[k] += d * d;
    }
    let rstd = T::ONE / (fold(acc) * inv_n + eps).sqrt();
    // Sums of dxhat and dxhat * xhat, and the column sums, in one pass.
    let (mut s1, mut s2) = ([T::ZERO; LANES], [T::ZERO; LANES]);
    let (xw, xt) = x.split_at(whole);
    let (dyw, dyt) = dy.split_at(whole);
    let (gw, gt) = gamma.split_at(whole);
    let (dgw, dgt) = dgamma.split_at_mut(whole);
    let (dbw, dbt) = dbeta.split_at_mut(whole);
    let chunks = xw.chunks_exact(LANES).zip(dyw.chunks_exact(LANES)).zip(gw.chunks_exact(LANES));
    for (((xc, dyc), gc), (dgc, dbc)) in chunks.zip(dgw.chunks_exact_mut(LANES).zip(dbw.chunks_exact_mut(LANES))) {
        for k in 0..LANES {
            let xhat = (xc[k] - mean) * rstd;
            let dxhat = dyc[k] * gc[k];
            s1[k] += dxhat;
            s2[k] += dxhat * xhat;
            dgc[k] += dyc[k] * xhat;
            dbc[k] += dyc[k];
        }
    }
    for k in 0..xt.len() {
        let xhat = (xt[k] - mean) * rstd;
        let dxhat = dyt[k] * gt[k];
        s1[k] += dxhat;
        s2[k] += dxhat * xhat;
        dgt[k] += dyt[k] * xhat;
        dbt[k] += dyt[k];
    }
    let (m1, m2) = (fold(s1) * inv_n, fold(s2) * inv_n);
    for (((o, &v), &d), &g) in dx.iter_mut().zip(x).zip(dy).zip(gamma) {
        let xhat = (v - mean) * rstd;
        o.write(rstd * (d * g - m1 - xhat * m2));
    }
}

/// Partial sums per reduction: four 256-bit vectors of f32 (eight of f64),
/// so consecutive adds do not wait on each other.
const LANES: usize = 32;

#[inline(always)]
fn fold<T: Real>(acc: [T; LANES]) -> T {
    // Pairwise, a fixed order.
    let mut v = acc;
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for k in 0..w {
            v[k] += v[k + w];
        }
    }
    v[0]
}

#[inline(always)]
fn sum<T: Real>(v: &[T]) -> T {
    let whole = v.len() - v.len() % LANES;
    let mut acc = [T::ZERO; LANES];
    for c in v[..whole].chunks_exact(LANES) {
        for k in 0..LANES {
            acc[k] += c[k];
        }
    }
    for (k, &x) in v[whole..].iter().enumerate() {
        acc[k] += x;
    }
    fold(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs [`rows`] portably, and compiled for AVX2 where the CPU has it.
    fn both<T: Real>(x: &[T], dy: &[T], gamma: &[T]) -> Vec<[Vec<T>; 3]> {
        let n = gamma.len();
        let eps = T::from_len(1) / T::from_len(100_000);
        let mut runs = Vec::new();
        let mut go = |avx2: bool| {
            let (mut dx, mut dg, mut db) = (Vec::with_capacity(x.len()), vec![T::ZERO; n], vec![T::ZERO; n]);
            let mut out = Out { dx: &mut dx.spare_capacity_mut()[..x.len()], dgamma: &mut dg, dbeta: &mut db };
            #[cfg(target_arch = "x86_64")]
            let has = std::is_x86_feature_detected!("avx2");
            #[cfg(not(target_arch = "x86_64"))]
            let has = false;
            if avx2 && !has {
                return;
            }
            rows(x, dy, gamma, eps, &mut out, avx2);
            // SAFETY: `rows` wrote every element of `dx`.
            unsafe { dx.set_len(x.len()) };
            runs.push([dx, dg, db]);
        };
        go(false);
        go(true);
        runs
    }

    /// Large calls run their blocks over the pool: 1, 2 and 3 threads give
    /// the bits of one pass, odd sizes and a last short block included.
    #[test]
    fn thread_counts_give_the_same_bits() {
        struct Restore;
        impl Drop for Restore {
            fn drop(&mut self) {
                tracejit_kernels::threads::set_num_threads(0);
            }
        }
        let _restore = Restore;
        for (rows_n, n) in [(1030usize, 64usize), (300, 257), (70, 1023)] {
            let x: Vec<f32> = (0..rows_n * n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.037).collect();
            let dy: Vec<f32> = (0..rows_n * n).map(|i| ((i * 53 % 89) as f32 - 44.0) * 0.021).collect();
            let gamma: Vec<f32> = (0..n).map(|j| 1.0 + (j % 7) as f32 * 0.1).collect();
            assert!(x.len() >= PARALLEL_VALUES, "large enough for the pool");
            let runs: Vec<Vec<[Vec<f32>; 3]>> = [1, 2, 3]
                .iter()
                .map(|&t| {
                    tracejit_kernels::threads::set_num_threads(t);
                    both(&x, &dy, &gamma)
                })
                .collect();
            let bits =
                |r: &[[Vec<f32>; 3]]| -> Vec<u32> { r.iter().flatten().flatten().map(|v| v.to_bits()).collect() };
            for r in &runs[1..] {
                assert!(bits(r) == bits(&runs[0]), "[{rows_n}, {n}]");
            }
        }
    }

    /// The AVX2 build vectorizes the same partial sums (no FMA, no
    /// reassociation), so it gives the portable code's bits, tails and
    /// several blocks included.
    #[test]
    fn the_avx2_build_gives_the_portable_bits() {
        for (rows_n, n) in [(1usize, 1usize), (3, 5), (2, 31), (70, 33), (130, 64), (2, 1023)] {
            let x: Vec<f64> = (0..rows_n * n).map(|i| ((i * 37 % 101) as f64 - 50.0) * 0.037).collect();
            let dy: Vec<f64> = (0..rows_n * n).map(|i| ((i * 53 % 89) as f64 - 44.0) * 0.021).collect();
            let gamma: Vec<f64> = (0..n).map(|j| 1.0 + (j % 7) as f64 * 0.1).collect();
            let r = both(&x, &dy, &gamma);
            if let [a, b] = &r[..] {
                assert!(a.iter().zip(b).all(|(p, q)| p.iter().zip(q).all(|(u, v)| u.to_bits() == v.to_bits())));
            }
            let f = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
            let r = both(&f(&x), &f(&dy), &f(&gamma));
            if let [a, b] = &r[..] {
                assert!(a.iter().zip(b).all(|(p, q)| p.iter().zip(q).all(|(u, v)| u.to_bits() == v.to_bits())));
            }
            assert!(r[0][0].iter().all(|v| v.is_finite()), "[{rows_n}, {n}]");
        }
    }
}
