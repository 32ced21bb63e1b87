//! f32 products with the `gemm` crate's microkernels chosen per call.
//!
//! Why: on a CPU with AVX-512F the crate's 16-lane kernels run the MLP
//! shapes 5-20% faster than its 8-lane AVX2 ones (64×784×512: 497 vs 603
//! µs, 64×512×1024: 653 vs 788 on one Zen 4 core), except when the
//! operand that becomes the kernel's left-hand side is not column-major
//! after the crate's canonical transposition: `a · bᵀ` with `b` stored
//! `[n, k]` (W6's `dy · wᵀ`) runs 2.2x *slower* at 16 lanes (64×512×512:
//! 833 vs 368 µs, 64×512×1024 likewise; at k = 784 the two sets tie,
//! which points at that operand being read at a stride of `k` elements
//! and a power-of-two stride crowding the L1 sets). The crate picks one
//! kernel set per process, so this
//! module repeats its canonical form (destination column-major, strides
//! positive) and calls its generic driver with the set that suits the
//! layout: 16 lanes when that operand's rows are adjacent, else 8.
//!
//! `JitOptions::avx512` off (`TRACEJIT_JIT_AVX512=0`) keeps every product
//! at 8 lanes. CPUs without AVX2 + FMA go through `gemm::gemm` unchanged.

use crate::options::JitOptions;

/// Which microkernels a product runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernels {
    /// AVX-512F, 16 lanes.
    Wide,
    /// AVX2 + FMA, 8 lanes.
    Narrow,
    /// Whatever `gemm::gemm` picks (CPUs without AVX2 + FMA).
    Crate,
}

/// One product as `gemm::gemm` takes it: `dst = alpha·dst + beta·(lhs·rhs)`
/// (when `read_dst`; else `beta·(lhs·rhs)`), `m×k` by `k×n`, strides in
/// elements, column stride first.
#[derive(Clone, Copy)]
pub(crate) struct Product<T> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dst: *mut T,
    pub dst_cs: isize,
    pub dst_rs: isize,
    pub read_dst: bool,
    pub lhs: *const T,
    pub lhs_cs: isize,
    pub lhs_rs: isize,
    pub rhs: *const T,
    pub rhs_cs: isize,
    pub rhs_rs: isize,
    pub alpha: T,
    pub beta: T,
}

impl<T: Copy + 'static> Product<T> {
    /// The crate's canonical form (as `gemm::gemm` builds it): destination
    /// column-major, then every stride the kernels walk positive. The same
    /// product.
    fn canonical(self) -> Self {
        let mut p = if self.dst_cs.abs() < self.dst_rs.abs() {
            Product {
                m: self.n,
                n: self.m,
                dst_cs: self.dst_rs,
                dst_rs: self.dst_cs,
                lhs: self.rhs,
                lhs_cs: self.rhs_rs,
                lhs_rs: self.rhs_cs,
                rhs: self.lhs,
                rhs_cs: self.lhs_rs,
                rhs_rs: self.lhs_cs,
                ..self
            }
        } else {
            self
        };
        if p.dst_rs < 0 && p.m > 0 {
            p.dst = p.dst.wrapping_offset((p.m - 1) as isize * p.dst_rs);
            p.dst_rs = -p.dst_rs;
            p.lhs = p.lhs.wrapping_offset((p.m - 1) as isize * p.lhs_rs);
            p.lhs_rs = -p.lhs_rs;
        }
        if p.dst_cs < 0 && p.n > 0 {
            p.dst = p.dst.wrapping_offset((p.n - 1) as isize * p.dst_cs);
            p.dst_cs = -p.dst_cs;
            p.rhs = p.rhs.wrapping_offset((p.n - 1) as isize * p.rhs_cs);
            p.rhs_cs = -p.rhs_cs;
        }
        if p.lhs_cs < 0 && p.k > 0 {
            p.lhs = p.lhs.wrapping_offset((p.k - 1) as isize * p.lhs_cs);
            p.lhs_cs = -p.lhs_cs;
            p.rhs = p.rhs.wrapping_offset((p.k - 1) as isize * p.rhs_rs);
            p.rhs_rs = -p.rhs_rs;
        }
        p
    }

    /// Through `gemm::gemm` with the crate's own kernel choice, on this
    /// thread.
    ///
    /// # Safety
    /// As `gemm::gemm`: the pointers and strides describe valid matrices,
    /// `dst` aliasing neither operand.
    pub(crate) unsafe fn run_crate(self) {
        let p = self;
        // SAFETY: forwarded from the caller.
        unsafe {
            gemm::gemm(
                p.m,
                p.n,
                p.k,
                p.dst,
                p.dst_cs,
                p.dst_rs,
                p.read_dst,
                p.lhs,
                p.lhs_cs,
                p.lhs_rs,
                p.rhs,
                p.rhs_cs,
                p.rhs_rs,
                p.alpha,
                p.beta,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        }
    }
}

impl Product<f32> {
    /// On this thread, with the kernels the layout suits (see the module).
    ///
    /// # Safety
    /// As [`Product::run_crate`].
    pub(crate) unsafe fn run(self) {
        // SAFETY: forwarded.
        unsafe { self.run_with(None) }
    }

    /// [`Product::run`] with the kernel set forced (`Some`, for tests; a
    /// set this CPU lacks falls back to the next narrower one).
    ///
    /// # Safety
    /// As [`Product::run_crate`].
    pub(crate) unsafe fn run_with(self, force: Option<Kernels>) {
        let p = self.canonical();
        let Product { m, n, k, dst, dst_cs, dst_rs, read_dst, lhs, lhs_cs, lhs_rs, rhs, rhs_cs, rhs_rs, alpha, beta } =
            p;
        let want = force.unwrap_or(if lhs_rs == 1 { Kernels::Wide } else { Kernels::Narrow });
        #[cfg(target_arch = "x86_64")]
        {
            use gemm_common::simd::{MixedSimd, V3, V4};
            macro_rules! drive {
                ($simd:expr, $module:ident, $lanes:expr) => {{
                    use gemm_f32::microkernel::$module::f32 as uk;
                    // SAFETY: forwarded from the caller, in the canonical form
                    // the driver expects; `$simd` proves the CPU features.
                    unsafe {
                        gemm_common::gemm::gemm_basic_generic::<
                            _,
                            f32,
                            { $lanes },
                            { uk::MR_DIV_N * $lanes },
                            { uk::NR },
                            { uk::MR_DIV_N },
                            { uk::H_M },
                            { uk::H_N },
                        >(
                            $simd,
                            m,
                            n,
                            k,
                            dst,
                            dst_cs,
                            dst_rs,
                            read_dst,
                            lhs,
                            lhs_cs,
                            lhs_rs,
                            rhs,
                            rhs_cs,
                            rhs_rs,
                            alpha,
                            beta,
                            false,
                            false,
                            false,
                            |a, b, c| a * b + c,
                            &uk::UKR,
                            &uk::H_UKR,
                            false,
                            gemm_common::Parallelism::None,
                        )
                    }
                    return;
                }};
            }
            if want == Kernels::Wide && (force.is_some() || JitOptions::global().avx512) {
                if let Some(simd) = <V4 as MixedSimd<f32, f32, f32, f32>>::try_new() {
                    drive!(simd, avx512f, 16);
                }
            }
            if want != Kernels::Crate {
                if let Some(simd) = <V3 as MixedSimd<f32, f32, f32, f32>>::try_new() {
                    drive!(simd, fma, 8);
                }
            }
        }
        let _ = want;
        // SAFETY: forwarded; already canonical, which `gemm::gemm` keeps.
        unsafe { p.run_crate() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A strided view of `data`: element `(i, j)` at `off + i·rs + j·cs`.
    struct View {
        off: isize,
        rs: isize,
        cs: isize,
    }

    /// Row-major, column-major, or reversed rows, for an `r×c` matrix.
    fn view(layout: u8, r: usize, c: usize) -> View {
        let (r, c) = (r as isize, c as isize);
        match layout {
            0 => View { off: 0, rs: c, cs: 1 },
            1 => View { off: 0, rs: 1, cs: r },
            _ => View { off: (r - 1).max(0) * c, rs: -c, cs: 1 },
        }
    }

    /// Every kernel set, every layout of `a`, `b` and `c`, odd and
    /// power-of-two sizes, with and without accumulation: within the
    /// product's rounding bound of an f64 reference.
    #[test]
    fn every_kernel_set_and_layout_matches_the_reference() {
        let mut seed = 0x2545_f491u32;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed % 2001) as f32 / 1000.0 - 1.0
        };
        let shapes = [(1, 1, 1), (3, 5, 1), (5, 3, 17), (17, 33, 5), (64, 512, 48), (40, 64, 33), (2, 0, 3)];
        for (m, k, n) in shapes {
            let a: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
            let b: Vec<f32> = (0..k * n).map(|_| rnd()).collect();
            let c0: Vec<f32> = (0..m * n).map(|_| rnd()).collect();
            for force in [Kernels::Wide, Kernels::Narrow, Kernels::Crate] {
                for (la, lb, lc) in (0..27u8).map(|x| (x % 3, x / 3 % 3, x / 9)) {
                    let (va, vb, vc) = (view(la, m, k), view(lb, k, n), view(lc, m, n));
                    // `a` and `b` hold the same values in every layout, read
                    // through their views.
                    let mut a2 = vec![0f32; m * k];
                    let mut b2 = vec![0f32; k * n];
                    for i in 0..m {
                        for p in 0..k {
                            a2[(va.off + i as isize * va.rs + p as isize * va.cs) as usize] = a[i * k + p];
                        }
                    }
                    for p in 0..k {
                        for j in 0..n {
                            b2[(vb.off + p as isize * vb.rs + j as isize * vb.cs) as usize] = b[p * n + j];
                        }
                    }
                    for acc in [false, true] {
                        let mut c = vec![0f32; m * n];
                        for i in 0..m {
                            for j in 0..n {
                                c[(vc.off + i as isize * vc.rs + j as isize * vc.cs) as usize] = c0[i * n + j];
                            }
                        }
                        // SAFETY: the views address the buffers' elements.
                        unsafe {
                            Product {
                                m,
                                n,
                                k,
                                dst: c.as_mut_ptr().offset(vc.off),
                                dst_cs: vc.cs,
                                dst_rs: vc.rs,
                                read_dst: acc,
                                lhs: a2.as_ptr().offset(va.off),
                                lhs_cs: va.cs,
                                lhs_rs: va.rs,
                                rhs: b2.as_ptr().offset(vb.off),
                                rhs_cs: vb.cs,
                                rhs_rs: vb.rs,
                                alpha: if acc { 1.0 } else { 0.0 },
                                beta: 1.0,
                            }
                            .run_with(Some(force))
                        };
                        for i in 0..m {
                            for j in 0..n {
                                let (mut want, mut mag) = (0f64, 0f64);
                                for p in 0..k {
                                    let t = f64::from(a[i * k + p]) * f64::from(b[p * n + j]);
                                    want += t;
                                    mag += t.abs();
                                }
                                if acc {
                                    want += f64::from(c0[i * n + j]);
                                    mag += f64::from(c0[i * n + j]).abs();
                                }
                                let got = f64::from(c[(vc.off + i as isize * vc.rs + j as isize * vc.cs) as usize]);
                                let tol = (k as f64 + 2.0) * f64::from(f32::EPSILON) * mag + 1e-30;
                                assert!(
                                    (got - want).abs() <= tol,
                                    "{force:?} {m}x{k}x{n} layouts {la}{lb}{lc} acc {acc}: ({i}, {j}) = {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
