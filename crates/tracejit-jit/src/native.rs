//! Hand-written kernels for region shapes where Cranelift's code falls
//! short, called through the same ABI as generated kernels (`kernel::abi`),
//! so the launcher, the thread split and the buffer pools treat them alike.
//!
//! Today one shape: the row softmax `exp(x - max(x)) / sum(exp(x - max(x)))`
//! over f32 rows (W3, and the softmax inside attention-style code). Its
//! generated kernel runs four passes in 128-bit vectors around the 256-bit
//! `exp` chunk function, and the passes around `exp` cost more than `exp`
//! itself; this kernel runs every pass in 256-bit AVX2 code with `exp`
//! computed straight into the output row.
//!
//! Results: the max is the reference's (a NaN row is scanned again in
//! order, as the generated kernel does); every `exp` is the JIT's own
//! approximation bit for bit ([`crate::fastmath::exp`]); the row sum adds in
//! a different order than the generated kernel's (four 8-lane partials),
//! so outputs agree with it within the sum's rounding, the tolerance every
//! float reduction of the JIT is checked against; the last pass multiplies
//! by the sum's reciprocal when that is a normal number, else divides,
//! like the generated kernel (`kernel::recip`).
//!
//! Only on x86_64 with AVX2 and FMA, and only when staging is on
//! (`JitOptions::stage`, which the `TRACEJIT_JIT_STAGE=0` test run turns off
//! to exercise the generated code).

use cranelift_entity::EntityRef;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, UnaryOp};

use crate::analysis::{Analysis, KernelKind, LNodeId, LOp, LoadId};
use crate::options::JitOptions;

/// The name and entry of a hand-written kernel for `an`, if one fits it and
/// this CPU.
pub(crate) fn kernel_for(an: &Analysis, opts: &JitOptions) -> Option<(&'static str, *const u8)> {
    if !opts.stage || !is_row_softmax(an) {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return Some(("row softmax", avx2::softmax_rows as *const u8));
        }
    }
    None
}

/// `y = softmax(x)` over one row with the hand-written kernel; false (and
/// `y` untouched) where this CPU lacks AVX2 and FMA.
pub(crate) fn softmax_row(x: &[f32], y: &mut [f32]) -> bool {
    assert_eq!(x.len(), y.len(), "softmax_row: input and output lengths differ");
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            if !x.is_empty() {
                // SAFETY: the features are present; the slices have equal lengths.
                unsafe { avx2::row(x, y) };
            }
            return true;
        }
    }
    false
}

/// True for a row region of one contiguous f32 input `x` and one full-size
/// f32 output `exp(x - max(x)) / sum(exp(x - max(x)))`, reduced over the
/// row, with nothing else computed.
fn is_row_softmax(an: &Analysis) -> bool {
    if an.kind != KernelKind::Row || an.loads.len() != 1 || an.outputs.len() != 1 {
        return false;
    }
    let (load, out) = (&an.loads[LoadId::new(0)], &an.outputs[0]);
    if load.dtype != DType::F32 || !load.contig || out.kept || out.dtype != DType::F32 {
        return false;
    }
    if an.nodes.values().any(|n| n.dtype != DType::F32) {
        return false;
    }
    let node = |id: LNodeId| &an.nodes[id];
    let is_x = |id: LNodeId| matches!(node(id).op, LOp::Load(l) if l.index() == 0);
    let (LOp::Binary(BinaryOp::Div), [e, s]) = (&node(out.node).op, &node(out.node).inputs[..]) else { return false };
    let (LOp::Reduce(ReduceOp::Sum), [e2]) = (&node(*s).op, &node(*s).inputs[..]) else { return false };
    let (LOp::Unary(UnaryOp::Exp), [d]) = (&node(*e).op, &node(*e).inputs[..]) else { return false };
    let (LOp::Binary(BinaryOp::Sub), [x, m]) = (&node(*d).op, &node(*d).inputs[..]) else { return false };
    let (LOp::Reduce(ReduceOp::Max), [x2]) = (&node(*m).op, &node(*m).inputs[..]) else { return false };
    e2 == e && is_x(*x) && is_x(*x2)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use crate::chunkmath::avx2::{exp, V};

    /// Row softmax over the ABI's argument block: `rows` rows of `n` f32
    /// values, input slot 0, output slot 1 (pointer and byte row stride
    /// each), inner elements contiguous.
    ///
    /// # Safety
    /// `args` is an argument block whose pointers address `rows` rows of
    /// `n` readable (input) and writable (output) f32 values at those
    /// strides, the output not aliasing the input; the CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe extern "C" fn softmax_rows(args: *const i64) {
        // SAFETY: forwarded from the caller (the layout of `kernel::abi`).
        unsafe {
            let a = |i: usize| *args.add(i);
            let (rows, n) = (a(0).max(0) as usize, a(1).max(0) as usize);
            let slot = crate::kernel::ARG_SLOTS;
            let (x, xs, y, ys) = (a(slot), a(slot + 1), a(slot + 2), a(slot + 3));
            if n == 0 {
                return;
            }
            for r in 0..rows as i64 {
                let xr = (x + r * xs) as *const f32;
                let yr = (y + r * ys) as *mut f32;
                row(std::slice::from_raw_parts(xr, n), std::slice::from_raw_parts_mut(yr, n));
            }
        }
    }

    /// One row: `y = softmax(x)`, `x` not empty, `y` as long.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn row(x: &[f32], y: &mut [f32]) {
        let n = x.len();
        // SAFETY: AVX2 and FMA are enabled; every load and store below is
        // at an index `i` with `i + 8 <= n` (vectors) or `i < n` (scalars).
        unsafe {
            let px = x.as_ptr();
            let py = y.as_mut_ptr();
            // Max: one `vmaxps` per vector, NaNs noted aside.
            let mut acc = [_mm256_set1_ps(f32::NEG_INFINITY); 4];
            let mut nan = _mm256_setzero_ps();
            let mut i = 0;
            while i + 32 <= n {
                for (k, a) in acc.iter_mut().enumerate() {
                    let v = _mm256_loadu_ps(px.add(i + 8 * k));
                    *a = _mm256_max_ps(v, *a);
                    nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
                }
                i += 32;
            }
            while i + 8 <= n {
                let v = _mm256_loadu_ps(px.add(i));
                acc[0] = _mm256_max_ps(v, acc[0]);
                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
                i += 8;
            }
            let v = _mm256_max_ps(_mm256_max_ps(acc[0], acc[1]), _mm256_max_ps(acc[2], acc[3]));
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), v);
            let mut m = lanes.iter().fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m });
            let mut tail_nan = false;
            for &v in &x[i..] {
                tail_nan |= v.is_nan();
                m = if v > m { v } else { m };
            }
            if tail_nan || _mm256_movemask_ps(nan) != 0 {
                // The reference's max: its first NaN, payload and all.
                m = x.iter().fold(f32::NEG_INFINITY, |m, &v| if m.is_nan() || m >= v { m } else { v });
            }
            // exp(x - m) into y, summed in four 8-lane partials.
            let mv = _mm256_set1_ps(m);
            let mut sum = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 32 <= n {
                for (k, s) in sum.iter_mut().enumerate() {
                    let e: V = exp(_mm256_sub_ps(_mm256_loadu_ps(px.add(i + 8 * k)), mv));
                    _mm256_storeu_ps(py.add(i + 8 * k), e);
                    *s = _mm256_add_ps(*s, e);
                }
                i += 32;
            }
            while i + 8 <= n {
                let e = exp(_mm256_sub_ps(_mm256_loadu_ps(px.add(i)), mv));
                _mm256_storeu_ps(py.add(i), e);
                sum[0] = _mm256_add_ps(sum[0], e);
                i += 8;
            }
            let v = _mm256_add_ps(_mm256_add_ps(sum[0], sum[1]), _mm256_add_ps(sum[2], sum[3]));
            _mm256_storeu_ps(lanes.as_mut_ptr(), v);
            let mut s = lanes.iter().sum::<f32>();
            for j in i..n {
                let e = crate::fastmath::exp(x[j] - m);
                y[j] = e;
                s += e;
            }
            // y / s, as x * (1 / s) when 1 / s is a normal number.
            if s.abs() >= f32::MIN_POSITIVE && s.abs() <= 2f32.powi(126) {
                let r = 1.0 / s;
                let rv = _mm256_set1_ps(r);
                map(y, |v| _mm256_mul_ps(v, rv), |v| v * r);
            } else {
                let sv = _mm256_set1_ps(s);
                map(y, |v| _mm256_div_ps(v, sv), |v| v / s);
            }
        }
    }

    /// `y[i] = f(y[i])`, eight at a time, the tail by `tail`.
    #[inline(always)]
    unsafe fn map(y: &mut [f32], f: impl Fn(V) -> V, tail: impl Fn(f32) -> f32) {
        let (n, py) = (y.len(), y.as_mut_ptr());
        let mut i = 0;
        // SAFETY: the caller has AVX enabled; every vector access is at
        // `i + 8 <= n`.
        unsafe {
            while i + 8 <= n {
                _mm256_storeu_ps(py.add(i), f(_mm256_loadu_ps(py.add(i))));
                i += 8;
            }
        }
        for v in &mut y[i..] {
            *v = tail(*v);
        }
    }
}
