//! Hand-written kernels for region shapes where Cranelift's code falls
//! short, called through the same ABI as generated kernels (`kernel::abi`),
//! so the launcher, the thread split and the buffer pools treat them alike.
//!
//! Today one shape: the row softmax `exp(x - max(x)) / sum(exp(x - max(x)))`
//! over f32 rows (W3, and the softmax inside attention-style code). Its
//! generated kernel runs four passes in 128-bit vectors around the vector
//! `exp` chunk function, and the passes around `exp` cost more than `exp`
//! itself; this kernel runs every pass in 512-bit AVX-512 or 256-bit AVX2
//! code (`chunkmath::width`) with `exp` computed straight into the output
//! row.
//!
//! Results: the max is the reference's (a NaN row is scanned again in
//! order, as the generated kernel does); every `exp` is the JIT's own
//! approximation bit for bit ([`crate::fastmath::exp`]); the row sum adds in
//! a different order than the generated kernel's (four partial vectors,
//! 8 or 16 lanes, by index from the row's start, so the bits depend on the
//! row alone, not on where its buffers lie), so outputs agree with it
//! within the sum's rounding, the tolerance every float reduction of the
//! JIT is checked against; the last pass multiplies by the sum's
//! reciprocal when that is a normal number, else divides, like the
//! generated kernel (`kernel::recip`).
//!
//! Only on x86_64 with AVX2 and FMA or AVX-512F, and only when staging is on
//! (`JitOptions::stage`, which the `TRACEJIT_JIT_STAGE=0` test run turns off
//! to exercise the generated code).

use cranelift_entity::EntityRef;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, UnaryOp};

use crate::analysis::{Analysis, KernelKind, LNodeId, LOp, LoadId};
use crate::chunkmath::{width, Width};
use crate::options::JitOptions;

/// The name and entry of a hand-written kernel for `an`, if one fits it and
/// this CPU.
pub(crate) fn kernel_for(an: &Analysis, opts: &JitOptions) -> Option<(&'static str, *const u8)> {
    if !opts.stage || !is_row_softmax(an) {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        match width(opts)? {
            Width::W16 => Some(("row softmax (16 lanes)", simd::softmax_rows_x16 as *const u8)),
            Width::W8 => Some(("row softmax (8 lanes)", simd::softmax_rows_x8 as *const u8)),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// `y = softmax(x)` over one row with the hand-written kernel at the
/// process's width ([`JitOptions::global`]); false (and `y` untouched)
/// where this CPU has neither AVX2 + FMA nor AVX-512F.
pub(crate) fn softmax_row(x: &[f32], y: &mut [f32]) -> bool {
    assert_eq!(x.len(), y.len(), "softmax_row: input and output lengths differ");
    #[cfg(target_arch = "x86_64")]
    {
        let Some(w) = width(&JitOptions::global()) else { return false };
        if !x.is_empty() {
            // SAFETY: `width` found the features; the slices have equal lengths.
            unsafe {
                match w {
                    Width::W16 => simd::row_x16(x, y),
                    Width::W8 => simd::row_x8(x, y),
                }
            }
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
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
mod simd {
    use std::arch::x86_64::*;

    use crate::chunkmath::lanes::Lanes;
    use crate::chunkmath::recipes::exp;

    macro_rules! entry_points {
        ($rows:ident, $row:ident, $v:ty, $features:literal) => {
            /// Row softmax over the ABI's argument block: `rows` rows of `n`
            /// f32 values, input slot 0, output slot 1 (pointer and byte row
            /// stride each), inner elements contiguous.
            ///
            /// # Safety
            /// `args` is an argument block whose pointers address `rows`
            /// rows of `n` readable (input) and writable (output) f32 values
            /// at those strides, the output not aliasing the input; the CPU
            /// has the features.
            #[target_feature(enable = $features)]
            pub(super) unsafe extern "C" fn $rows(args: *const i64) {
                // SAFETY: forwarded from the caller.
                unsafe { rows::<$v>(args) }
            }

            /// One row: `y = softmax(x)`, `x` not empty, `y` as long.
            ///
            /// # Safety
            /// The CPU has the features.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $row(x: &[f32], y: &mut [f32]) {
                // SAFETY: forwarded from the caller.
                unsafe { row::<$v>(x, y) }
            }
        };
    }
    entry_points!(softmax_rows_x8, row_x8, __m256, "avx2,fma");
    entry_points!(softmax_rows_x16, row_x16, __m512, "avx512f");

    /// See the entry points.
    #[inline(always)]
    unsafe fn rows<V: Lanes>(args: *const i64) {
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
                row::<V>(std::slice::from_raw_parts(xr, n), std::slice::from_raw_parts_mut(yr, n));
            }
        }
    }

    /// Lanes of `v`, first to last.
    #[inline(always)]
    unsafe fn lanes<V: Lanes>(v: V) -> [f32; 16] {
        let mut out = [0.0f32; 16];
        // SAFETY: `out` has room for every width's lanes.
        unsafe { v.store(out.as_mut_ptr()) };
        out
    }

    /// One row at width `V`, `x` not empty, `y` as long.
    #[inline(always)]
    unsafe fn row<V: Lanes>(x: &[f32], y: &mut [f32]) {
        let (n, w) = (x.len(), V::LANES);
        // SAFETY: the caller enabled `V`'s features; every load and store
        // below is at an index `i` with `i + w <= n` (vectors) or `i < n`
        // (scalars).
        unsafe {
            let px = x.as_ptr();
            let py = y.as_mut_ptr();
            // Max: one `vmaxps` per vector, NaNs noted aside.
            let mut acc = [V::splat(f32::NEG_INFINITY); 4];
            let mut nan = V::zero();
            let mut i = 0;
            while i + 4 * w <= n {
                for (k, a) in acc.iter_mut().enumerate() {
                    let v = V::load(px.add(i + w * k));
                    *a = v.max(*a);
                    nan = v.or_nan(nan);
                }
                i += 4 * w;
            }
            while i + w <= n {
                let v = V::load(px.add(i));
                acc[0] = v.max(acc[0]);
                nan = v.or_nan(nan);
                i += w;
            }
            let v = acc[0].max(acc[1]).max(acc[2].max(acc[3]));
            let mut m = lanes(v)[..w].iter().fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m });
            let mut tail_nan = false;
            for &v in &x[i..] {
                tail_nan |= v.is_nan();
                m = if v > m { v } else { m };
            }
            if tail_nan || nan.any() {
                // The reference's max: its first NaN, payload and all.
                m = x.iter().fold(f32::NEG_INFINITY, |m, &v| if m.is_nan() || m >= v { m } else { v });
            }
            // exp(x - m) into `t`, summed in four partial vectors (and the
            // tail aside): `y`, or a scratch row on the stack where
            // `y` lies a few bytes past a multiple of 4 KiB from `x` (two
            // heap blocks allocated one after the other): there every load
            // of `x` would wait for the store to `y` just before it, whose
            // address matches in the low 12 bits (4K aliasing; W3 ran 15%
            // slower with such buffers).
            let mut scratch = [std::mem::MaybeUninit::<f32>::uninit(); SCRATCH + SCRATCH_SLACK];
            let t = if n <= SCRATCH && aliases(px, py) {
                scratch_row(scratch.as_mut_ptr().cast::<f32>(), px, py)
            } else {
                py
            };
            let mv = V::splat(m);
            let mut sum = [V::zero(); 4];
            let mut i = 0;
            while i + 4 * w <= n {
                for (k, s) in sum.iter_mut().enumerate() {
                    let e = exp(V::load(px.add(i + w * k)).sub(mv));
                    e.store(t.add(i + w * k));
                    *s = s.add(e);
                }
                i += 4 * w;
            }
            while i + w <= n {
                let e = exp(V::load(px.add(i)).sub(mv));
                e.store(t.add(i));
                sum[0] = sum[0].add(e);
                i += w;
            }
            let v = sum[0].add(sum[1]).add(sum[2].add(sum[3]));
            let mut s = lanes(v)[..w].iter().sum::<f32>();
            for (j, &xj) in x.iter().enumerate().skip(i) {
                let e = crate::fastmath::exp(xj - m);
                *t.add(j) = e;
                s += e;
            }
            // y = t / s, as t * (1 / s) when 1 / s is a normal number.
            let scale = s.abs() >= f32::MIN_POSITIVE && s.abs() <= 2f32.powi(126);
            let (r, sv) = (1.0 / s, V::splat(s));
            let rv = V::splat(r);
            let mut i = 0;
            // Both loops written out: a closure would be compiled without
            // the entry point's target features.
            if scale {
                while i + w <= n {
                    V::load(t.add(i)).mul(rv).store(py.add(i));
                    i += w;
                }
                (i..n).for_each(|j| *py.add(j) = *t.add(j) * r);
            } else {
                while i + w <= n {
                    V::load(t.add(i)).div(sv).store(py.add(i));
                    i += w;
                }
                (i..n).for_each(|j| *py.add(j) = *t.add(j) / s);
            }
        }
    }

    /// Longest row that goes through the stack scratch row when its
    /// buffers alias (16 KiB, with the input and output rows within L1).
    const SCRATCH: usize = 4096;
    /// Room to place the scratch row away from both buffers' 4 KiB offsets.
    const SCRATCH_SLACK: usize = 1024;
    /// Distance in bytes, modulo 4 KiB, below which a store to one buffer
    /// and a load from the other are taken for the same address.
    const NEAR: usize = 256;

    /// Circular distance of two addresses' offsets within a 4 KiB page.
    fn page_distance(a: *const f32, b: *const f32) -> usize {
        let d = (a as usize).wrapping_sub(b as usize) % 4096;
        d.min(4096 - d)
    }

    /// True when a row of `x` and the row of `y` at the same index are
    /// nearly a multiple of 4 KiB apart.
    fn aliases(x: *const f32, y: *const f32) -> bool {
        page_distance(x, y) < NEAR
    }

    /// A place for a row in `buf` (`SCRATCH + SCRATCH_SLACK` floats),
    /// 64-byte aligned and at least [`NEAR`] bytes (modulo 4 KiB) from both
    /// `x` and `y`: at most 16 of a page's 64 aligned offsets are near one
    /// of them, and the slack spans 63.
    fn scratch_row(buf: *mut f32, x: *const f32, y: *const f32) -> *mut f32 {
        let base = buf.wrapping_add((buf as usize).wrapping_neg() % 64 / 4);
        (0..SCRATCH_SLACK / 16 - 1)
            .map(|k| base.wrapping_add(16 * k))
            .find(|&t| page_distance(t, x) >= NEAR && page_distance(t, y) >= NEAR)
            .unwrap_or(base)
    }
}
