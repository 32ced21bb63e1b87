//! bf16 products for the executor: what `matmul(cast(a, f32), cast(b, f32))`
//! of bf16 values computes (exact products, f32 sums), run on the bf16 GEMM
//! of `tracejit_kernels::bf16` (`vdpbf16ps` where the CPU has AVX-512 BF16)
//! straight from the operands, with no widened copies. An operand may also
//! be f32 that the graph rounds to bf16 first (`cast(cast(x, bf16), f32)`,
//! what `auto_mixed_precision` writes): the kernel rounds it while packing,
//! the same nearest-even rounding as the cast.
//!
//! The right operand is packed into bf16 pairs once per buffer when it is a
//! variable's value or a constant (or a transposed view of one): a weight
//! is packed once per version, not once per call. The `bf16_products` pass
//! (`codegen`) decides which products run here.

use std::sync::{Arc, Mutex};

use ndarray::{ArrayView2, IxDyn};
use tracejit_ir::tensor::{kernels, DType, Storage};
use tracejit_kernels::bf16::{gemm_bf16, gemm_bf16_from_f32, PackedBf16};
use tracejit_kernels::Isa;

use crate::region::BufPool;

/// A product the `bf16_products` pass moved onto the bf16 GEMM.
pub(crate) struct Bf16Product {
    /// Per operand: true when its value is f32 to round to bf16, false
    /// when it is bf16 already.
    pub round: [bool; 2],
    /// The right operand is a variable's value or a constant: keep its
    /// packing for as long as its buffer is the same.
    pub cache_rhs: bool,
    /// The last packed right operand and the value it was packed from
    /// (held, so its buffer cannot be freed and reused while cached).
    packed: Mutex<Option<(Storage, Arc<PackedBf16>)>>,
}

impl Bf16Product {
    pub(crate) fn new(round: [bool; 2], cache_rhs: bool) -> Bf16Product {
        Bf16Product { round, cache_rhs, packed: Mutex::new(None) }
    }

    /// How the listing shows it: `bf16 matmul (lhs rounded, rhs packed once)`.
    pub(crate) fn describe(&self) -> String {
        let side = |r: bool| if r { "f32 rounded" } else { "bf16" };
        let cache = if self.cache_rhs { ", rhs packed once per version" } else { "" };
        format!("matmul_bf16 (lhs {}, rhs {}{cache})", side(self.round[0]), side(self.round[1]))
    }

    /// `a · b` accumulated in f32, into a pooled buffer when one fits.
    pub(crate) fn run(&self, isa: Isa, a: &Storage, b: &Storage, pool: &mut BufPool) -> Storage {
        self.run_with(isa, a, b, &mut |d, s| pool.take(d, s))
    }

    /// [`Bf16Product::run`] with the output buffer from `take` (a product
    /// run on a worker thread gets one taken beforehand).
    pub(crate) fn run_with(
        &self,
        isa: Isa,
        a: &Storage,
        b: &Storage,
        take: &mut dyn FnMut(DType, &[usize]) -> Option<Storage>,
    ) -> Storage {
        let fast = self.lhs_rows(a).zip(rhs_matrix(b)).filter(|((_, k), (k2, _))| k == k2);
        let Some(((rows, k), (_, n))) = fast else {
            return self.widened(a, b);
        };
        let mut shape = a.shape().to_vec();
        *shape.last_mut().expect("rank >= 2") = n;
        let packed = self.packed_rhs(b);
        let mut out = match take(DType::F32, &shape) {
            Some(Storage::F32(buf)) if buf.is_standard_layout() && crate::region::same_shape(buf.shape(), &shape) => {
                buf
            }
            _ => ndarray::ArcArray::zeros(IxDyn(&shape)),
        };
        let c = out.as_slice_mut().expect("a fresh or pooled buffer is contiguous");
        if k == 0 {
            c.fill(0.0);
            return Storage::F32(out);
        }
        match a {
            Storage::F32(x) => gemm_bf16_from_f32(lhs_view(x, rows, k), &packed, c, false, isa),
            Storage::BF16(x) => gemm_bf16(lhs_view(x, rows, k), &packed, c, false, isa),
            other => unreachable!("the bf16_products pass gives f32 or bf16 operands, not {}", other.dtype()),
        }
        Storage::F32(out)
    }

    /// `(rows, k)` of the lhs when it is a matrix, or a stack of matrices
    /// in standard layout (their rows run as one product).
    fn lhs_rows(&self, a: &Storage) -> Option<(usize, usize)> {
        let s = a.shape();
        let ok = matches!((a, self.round[0]), (Storage::F32(_), true) | (Storage::BF16(_), false));
        if !ok || s.len() < 2 || (s.len() > 2 && !a.is_standard_layout()) {
            return None;
        }
        let k = s[s.len() - 1];
        Some((s[..s.len() - 1].iter().product(), k))
    }

    /// The packed rhs: the cached one while `b` is the same buffer.
    fn packed_rhs(&self, b: &Storage) -> Arc<PackedBf16> {
        if self.cache_rhs {
            let cached = self.packed.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((held, p)) = cached.as_ref() {
                if held.same_elements(b) {
                    return p.clone();
                }
            }
        }
        let p = Arc::new(pack(b));
        if self.cache_rhs {
            *self.packed.lock().unwrap_or_else(|p| p.into_inner()) = Some((b.clone(), p.clone()));
        }
        p
    }

    /// Shapes the fast path does not take (a batched rhs): the product of
    /// the rounded, widened operands through the reference kernel, which
    /// is the same computation.
    fn widened(&self, a: &Storage, b: &Storage) -> Storage {
        let widen = |x: &Storage, round: bool| {
            let low = if round { kernels::cast(x, DType::BF16) } else { x.clone() };
            kernels::cast(&low, DType::F32)
        };
        crate::gemm::matmul(&widen(a, self.round[0]), &widen(b, self.round[1]))
    }
}

/// `(k, n)` of a 2-D rhs of f32 or bf16.
fn rhs_matrix(b: &Storage) -> Option<(usize, usize)> {
    match (b, b.shape()) {
        (Storage::F32(_) | Storage::BF16(_), &[k, n]) => Some((k, n)),
        _ => None,
    }
}

/// The lhs as a `[rows, k]` matrix view (a stack of matrices flattened).
fn lhs_view<T>(x: &ndarray::ArcArray<T, IxDyn>, rows: usize, k: usize) -> ArrayView2<'_, T> {
    if x.ndim() == 2 {
        return x.view().into_dimensionality().expect("rank 2");
    }
    x.view().into_shape_with_order((rows, k)).expect("a standard-layout stack of rows")
}

/// `b` packed into bf16 pairs (f32 rounded to nearest even).
fn pack(b: &Storage) -> PackedBf16 {
    match b {
        Storage::F32(x) => PackedBf16::from_f32(x.view().into_dimensionality().expect("rank 2")),
        Storage::BF16(x) => PackedBf16::from_bf16(x.view().into_dimensionality::<ndarray::Ix2>().expect("rank 2")),
        other => unreachable!("the bf16_products pass gives f32 or bf16 operands, not {}", other.dtype()),
    }
}
