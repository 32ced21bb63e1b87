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
//! A row-major left-hand side in that form (`a · bᵀ` with `b` stored
//! `[n, k]`) is copied column-major first where the crate's packing of it
//! is slow ([`Product::repacks`]).
//!
//! An [`Isa`] without AVX-512 (`JitOptions::avx512` off, `TRACEJIT_JIT_AVX512=0`) keeps every product
//! at 8 lanes. CPUs without AVX2 + FMA go through `gemm::gemm` unchanged.

use super::transpose;
use crate::Isa;

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
    /// `m` of the whole product this one is a thread block of (layout
    /// choices depend on the whole, see [`Product::repacks`]).
    pub whole_m: usize,
    /// `n` of the whole product.
    pub whole_n: usize,
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
    pub(super) fn canonical(self) -> Self {
        let mut p = if self.dst_cs.abs() < self.dst_rs.abs() {
            Product {
                whole_m: self.whole_n,
                whole_n: self.whole_m,
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

/// The narrowest canonical `n` (the original product's rows, for a
/// row-major destination) at which a row-major lhs is repacked.
const REPACK_MIN_N: usize = 8;

/// The canonical `n` of a whole product (the original product's rows, for
/// a row-major destination) from which a row-major lhs is always repacked
/// ([`Product::repacks`]).
const REPACK_TALL_N: usize = 256;

/// The canonical `n` of a whole product from which a row-major lhs is
/// repacked for the 16-lane kernels on a CPU with full-rate 512-bit FMAs
/// ([`Product::repacks`]).
const REPACK_WIDE_N: usize = 64;

/// Whether this CPU runs 512-bit FMAs at the full rate (twice the 256-bit
/// rate): AVX-512F on any CPU but an AMD Zen 4 (family 19h), whose 512-bit
/// operations take two passes through 256-bit units. Known CPU models, not
/// a timing, so that a process's products round the same way every run.
pub(crate) fn full_rate_512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static FULL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *FULL.get_or_init(|| {
            use std::arch::x86_64::__cpuid;
            // Leaves 0 and 1 exist on every x86-64 CPU.
            let (vendor, sig) = (__cpuid(0), __cpuid(1));
            let avx512 = std::arch::is_x86_feature_detected!("avx512f");
            full_rate_for(avx512, [vendor.ebx, vendor.edx, vendor.ecx], sig.eax)
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// A CPUID vendor string as leaf 0 returns it, in `ebx`, `edx`, `ecx`.
fn vendor_words(s: &[u8; 12]) -> [u32; 3] {
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    [word(0), word(1), word(2)]
}

/// [`full_rate_512`] of a CPU with (or without) AVX-512F, the vendor
/// string of CPUID leaf 0 (`ebx`, `edx`, `ecx`) and the signature of leaf 1
/// (`eax`).
fn full_rate_for(avx512: bool, vendor: [u32; 3], signature: u32) -> bool {
    let amd = vendor == vendor_words(b"AuthenticAMD");
    let base = (signature >> 8) & 0xf;
    let family = if base == 0xf { base + ((signature >> 20) & 0xff) } else { base };
    avx512 && !(amd && family == 0x19)
}

/// The largest repacking buffer (in values, 16 MiB) a thread keeps
/// between products; a larger one is freed after its product.
const KEEP_SCRATCH: usize = 1 << 22;

/// 64 bytes of f32, so the repacked operand starts on a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

thread_local! {
    /// Each thread's buffer for repacked operands, grown to the largest
    /// and kept, so that a steady-state call allocates nothing here.
    static SCRATCH: std::cell::RefCell<Vec<Line>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Product<f32> {
    /// On this thread, with the kernels the layout suits (see the module).
    ///
    /// # Safety
    /// As [`Product::run_crate`].
    pub(crate) unsafe fn run(self, isa: Isa) {
        // SAFETY: forwarded.
        unsafe { self.run_with(None, isa) }
    }

    /// [`Product::run`] with the kernel set forced (`Some`, for tests; a
    /// set this CPU lacks falls back to the next narrower one).
    ///
    /// # Safety
    /// As [`Product::run_crate`].
    pub(crate) unsafe fn run_with(self, force: Option<Kernels>, isa: Isa) {
        let p = self.canonical();
        // A short side and both operands along `k`: dot products.
        #[cfg(target_arch = "x86_64")]
        if force != Some(Kernels::Crate) && p.dots() {
            use std::arch::is_x86_feature_detected as has;
            let wide = force.unwrap_or(Kernels::Wide) == Kernels::Wide && (force.is_some() || isa.avx512_allowed());
            if wide && has!("avx512f") {
                // SAFETY: forwarded; the CPU has AVX-512F and `dots` holds.
                return unsafe { p.dots_w16() };
            }
            if has!("avx2") && has!("fma") {
                // SAFETY: as above, with AVX2 and FMA.
                return unsafe { p.dots_w8() };
            }
        }
        if force != Some(Kernels::Crate) && p.repacks(isa.avx512_allowed() && full_rate_512()) {
            let mut p = p;
            return SCRATCH.with(|cell| match cell.try_borrow_mut() {
                Ok(mut lines) => {
                    let values = p.m * p.k;
                    if lines.len() * 16 < values {
                        lines.resize(values.div_ceil(16), Line([0.0; 16]));
                    }
                    // SAFETY: `Line` is 16 f32 values without padding.
                    let scratch = unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<f32>(), values) };
                    // SAFETY: forwarded; the canonical lhs is `m` rows of
                    // `k` adjacent values at stride `lhs_rs`.
                    unsafe { transpose::to_column_major(p.lhs, p.m, p.k, p.lhs_rs, scratch) };
                    (p.lhs, p.lhs_rs, p.lhs_cs) = (scratch.as_ptr(), 1, p.m as isize);
                    // SAFETY: as the caller's product, with the lhs copied;
                    // still canonical.
                    unsafe { p.drive(force, isa) };
                    if lines.len() * 16 > KEEP_SCRATCH {
                        *lines = Vec::new();
                    }
                }
                // A product inside a product (never, today): no repacking.
                // SAFETY: forwarded.
                Err(_) => unsafe { p.drive(force, isa) },
            });
        }
        // SAFETY: forwarded.
        unsafe { p.drive(force, isa) }
    }

    /// Whether the canonical lhs is copied column-major before the call.
    /// It is, when it is row-major (`a · bᵀ` with `b` stored `[n, k]`:
    /// linear layers with `[out, in]` weights, the backward pass's
    /// `dy · wᵀ`) and the crate's own packing of it from rows is slow:
    /// products of 8 to 63 rows (the canonical `n`; 32×512×512 218 vs 308
    /// µs, 8×1024×256 130 vs 357, 32×128×128 11 vs 14), and rows 4 KiB
    /// apart (64×1024×256 430 vs 619). From 64 rows at other strides the
    /// crate packs as fast as the copy (64×512×512 373 vs 376; 64×256×1024
    /// 429 vs 376 would lose); below 8 the copy of the whole operand
    /// outweighs the product.
    ///
    /// And whenever the whole product has at least [`REPACK_TALL_N`]
    /// rows, which share the copy: on the Xeon (Emerald Rapids) sessions
    /// 20-26 ran on, the crate's 8-lane kernels on such a layout ran at
    /// 25 G multiply-adds/s where the copy and the 16-lane kernels ran at
    /// 46-51 (1024×256×1024: 10.6 against 5.9 ms; 1024×768×256 7.9
    /// against 4.0; W10's backward `dy · wᵀ` products); the copy is
    /// `1/rows` of the product's work on any CPU.
    ///
    /// And from [`REPACK_WIDE_N`] rows when the copied operand goes to
    /// the 16-lane kernels on a CPU that runs 512-bit FMAs at full rate
    /// (`wide`, [`full_rate_512`]): there the 8-lane kernels the row-major
    /// layout takes run at half the 16-lane rate (an AMD Zen 5, one core,
    /// `examples/gemm_layouts`: 64×512×512 `a·bᵀ` 332 -> 191 µs,
    /// 64×784×512 511 -> 298, W6's step 1,246 -> 1,120 µs), where on a
    /// Zen 4, which splits 512-bit operations in two, they tie (64×512×512
    /// 373 vs 376) or the copy loses (64×256×1024 429 vs 376).
    ///
    /// The same answer for a product and each of its thread blocks, so
    /// that results keep their bits whatever the thread count: a split
    /// axis has blocks over 64 wide (`threads::GemmBlocks`), on the same
    /// side of every threshold here as the whole, and the tall rules read
    /// the whole product's rows.
    fn repacks(&self, wide: bool) -> bool {
        let thin = (REPACK_MIN_N..64).contains(&self.n);
        let tall = self.whole_n >= REPACK_TALL_N || (wide && self.whole_n >= REPACK_WIDE_N);
        let aliasing = self.lhs_rs.unsigned_abs().is_multiple_of(1024);
        self.lhs_cs == 1
            && self.lhs_rs != 1
            && self.m >= 8
            && self.k >= 8
            && self.n >= REPACK_MIN_N
            && (thin || aliasing || tall)
    }

    /// The canonical product through the crate's driver with the kernels
    /// the layout suits, or `force`.
    ///
    /// # Safety
    /// As [`Product::run_crate`], and `self` canonical.
    unsafe fn drive(self, force: Option<Kernels>, isa: Isa) {
        let p = self;
        let Product {
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
            ..
        } = p;
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
            if want == Kernels::Wide && (force.is_some() || isa.avx512_allowed()) {
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
        let shapes = [
            (1, 1, 1),
            (3, 5, 1),
            (5, 3, 17),
            (17, 33, 5),
            (64, 512, 48),
            (40, 64, 33),
            (70, 1024, 9),
            (260, 24, 19),
            (2, 0, 3),
        ];
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
                                whole_m: m,
                                whole_n: n,
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
                            .run_with(Some(force), Isa::native())
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

    /// `a · bᵀ` (`b` stored `[n, k]`, a row-major canonical lhs) repacks
    /// when the whole product has [`REPACK_TALL_N`] rows or more, and a
    /// thread block of it decides as the whole does (its bits do not
    /// depend on the thread count).
    #[test]
    fn tall_products_repack_and_their_blocks_agree() {
        let (a, b, mut c) = ([0f32; 4], [0f32; 4], [0f32; 4]);
        let dst = c.as_mut_ptr();
        let product = |whole_m: usize, m: usize| Product {
            whole_m,
            whole_n: 512,
            m,
            n: 512,
            k: 300,
            dst,
            dst_cs: 1,
            dst_rs: 512,
            read_dst: false,
            lhs: a.as_ptr(),
            lhs_cs: 1,
            lhs_rs: 300,
            rhs: b.as_ptr(),
            rhs_cs: 300,
            rhs_rs: 1,
            alpha: 0.0,
            beta: 1.0,
        };
        for wide in [false, true] {
            assert!(product(1024, 1024).canonical().repacks(wide));
            assert!(product(1024, 128).canonical().repacks(wide), "a 128-row block of a tall product");
        }
        assert!(!product(128, 128).canonical().repacks(false), "a product of 128 rows keeps the crate's packing");
        // For the 16-lane kernels at full rate, from 64 rows, and every
        // block of such a product alike.
        assert!(product(128, 128).canonical().repacks(true));
        assert!(product(128, 64).canonical().repacks(true), "a 64-row block of a 128-row product");
        assert!(product(64, 64).canonical().repacks(true));
    }

    /// Only an AMD Zen 4 among AVX-512 CPUs is taken for half-rate 512-bit
    /// FMAs, and a CPU without AVX-512 never repacks for 16 lanes.
    #[test]
    fn only_zen_4_runs_512_bits_at_half_rate() {
        let (amd, intel) = (super::vendor_words(b"AuthenticAMD"), super::vendor_words(b"GenuineIntel"));
        // CPUID 1 eax: base family 0xf plus the extended family.
        let (zen3, zen4, zen5) = (0x00a2_0f10, 0x00a1_0f11, 0x00b4_0f40);
        assert!(!super::full_rate_for(true, amd, zen4));
        assert!(super::full_rate_for(true, amd, zen5));
        assert!(!super::full_rate_for(false, amd, zen3));
        // Family 6, as every recent Intel core.
        assert!(super::full_rate_for(true, intel, 0x000c_06f2));
        assert!(!super::full_rate_for(false, intel, 0x000c_06f2));
    }
}
