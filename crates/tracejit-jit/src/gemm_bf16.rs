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
//! is packed once per version, not once per call. When it is an argument
//! (weights passed in, as to a `jax.jit`'s `apply(params, x)`), the packing
//! is kept while calls pass the same buffer again — values are immutable,
//! and the held clone keeps the buffer from being freed or written in
//! place — and given up at the first two calls in a row that pass new
//! buffers (a training loop's updated weights), so that it never holds
//! an old weight alive there; torch's autocast keeps its weight casts the
//! same way. Products multiplying by the same buffer share one packing
//! (`SHARED`), in one executable or several. The `bf16_products` pass
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
    /// Where the right operand comes from, which decides whether its
    /// packing is kept.
    pub rhs: RhsSource,
    /// The last packed right operand and what decides keeping the next.
    packed: Mutex<Cached>,
}

/// Where a product's right operand comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RhsSource {
    /// A variable's value or a constant (or a transposed view of one):
    /// its packing is kept for as long as its buffer is the same.
    Weight,
    /// An argument of the call (or a transposed view of one): its packing
    /// is kept while calls pass the same buffer (see the module).
    Argument,
    /// Computed in the call: packed every time.
    Computed,
}

/// A packed right operand, with the value it was packed from for the
/// packings that are kept (held, so its buffer cannot be freed, reused or
/// written in place while the packing may be found by it).
pub(crate) struct Packing {
    from: Option<Storage>,
    isa: Isa,
    packed: PackedBf16,
}

impl std::ops::Deref for Packing {
    type Target = PackedBf16;

    fn deref(&self) -> &PackedBf16 {
        &self.packed
    }
}

impl Packing {
    /// Whether this is `b` packed for `isa`.
    fn packs(&self, b: &Storage, isa: Isa) -> bool {
        self.isa == isa && self.from.as_ref().is_some_and(|f| f.same_elements(b))
    }
}

/// The kept packings any product holds, found by the buffer they were
/// packed from: every product multiplying by one weight or argument buffer
/// shares its packing, in one executable or several. A sentence embedder
/// runs each length bucket's layers as products of their own (W15: six
/// buckets in one graph), and each packed every weight for itself: six
/// copies of all-MiniLM-L6-v2's products' weights, 111 MB held under
/// `mixed_precision` where 18.5 suffice. Entries die with the last
/// product holding them (a new version of a weight replaces them in every
/// product).
static SHARED: Mutex<Vec<std::sync::Weak<Packing>>> = Mutex::new(Vec::new());

/// `b`'s packing for `isa` from [`SHARED`], else packed now and shared.
fn shared_packing(b: &Storage, isa: Isa) -> Arc<Packing> {
    let found = {
        let shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        shared.iter().filter_map(std::sync::Weak::upgrade).find(|p| p.packs(b, isa))
    };
    if let Some(p) = found {
        return p;
    }
    let p = Arc::new(Packing { from: Some(b.clone()), isa, packed: pack(b, isa) });
    let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    shared.retain(|w| w.strong_count() > 0);
    shared.push(Arc::downgrade(&p));
    p
}

/// A product's kept packing.
#[derive(Default)]
struct Cached {
    /// The packed right operand, holding the value it was packed from.
    entry: Option<Arc<Packing>>,
    /// Calls that found `entry` since it was stored.
    hits: u64,
    /// Whether an argument's packing was ever kept.
    stored: bool,
}

impl Bf16Product {
    pub(crate) fn new(round: [bool; 2], rhs: RhsSource) -> Bf16Product {
        Bf16Product { round, rhs, packed: Mutex::new(Cached::default()) }
    }

    /// How the listing shows it: `bf16 matmul (lhs rounded, rhs packed once)`.
    pub(crate) fn describe(&self) -> String {
        let side = |r: bool| if r { "f32 rounded" } else { "bf16" };
        let cache = match self.rhs {
            RhsSource::Weight => ", rhs packed once per version",
            RhsSource::Argument => ", rhs packed once while the argument repeats",
            RhsSource::Computed => "",
        };
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
        let packed = self.packed_rhs(b, isa);
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

    /// Rows `rows` of `a · b` into the `[m, n]` f32 buffer at `out`, on the
    /// calling thread, from `b` packed beforehand ([`Self::packed_rhs`]):
    /// a part of a product the executor runs in row blocks beside the
    /// region consuming it (`executor/epilogue.rs`). False (nothing
    /// written) unless `a` is a 2-D operand of this product fitting
    /// `packed` and `rows` lies in its rows.
    ///
    /// # Safety
    /// `out` is the element pointer of a standard-layout `[m, n]` f32
    /// buffer aliasing neither operand; concurrent calls take disjoint
    /// rows.
    pub(crate) unsafe fn product_rows(
        &self,
        isa: Isa,
        a: &Storage,
        packed: &PackedBf16,
        out: i64,
        rows: std::ops::Range<usize>,
    ) -> bool {
        let Some((m, k)) = self.lhs_rows(a).filter(|_| a.shape().len() == 2) else { return false };
        let n = packed.n();
        if k != packed.k() || rows.end > m || rows.start > rows.end {
            return false;
        }
        // SAFETY: the caller's contract: rows `rows` of the output.
        let c = unsafe { std::slice::from_raw_parts_mut((out as *mut f32).add(rows.start * n), rows.len() * n) };
        if k == 0 {
            c.fill(0.0);
            return true;
        }
        let part = ndarray::s![rows, ..];
        crate::threads::serial(|| match a {
            Storage::F32(x) => gemm_bf16_from_f32(lhs_view(x, m, k).slice(part), packed, c, false, isa),
            Storage::BF16(x) => gemm_bf16(lhs_view(x, m, k).slice(part), packed, c, false, isa),
            other => unreachable!("lhs_rows accepts f32 or bf16 operands, not {}", other.dtype()),
        });
        true
    }

    /// Whether [`Self::product_rows`] takes `a`: a 2-D operand of this
    /// product's lhs dtype.
    pub(crate) fn takes_rows_of(&self, a: &Storage) -> bool {
        a.shape().len() == 2 && self.lhs_rows(a).is_some()
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

    /// The packed rhs: the kept one while `b` is the same buffer; else
    /// packed now, and kept for a weight always, for an argument on the
    /// first call and after a kept packing was used again (so a loop
    /// passing new buffers every call keeps nothing from its second call on).
    pub(crate) fn packed_rhs(&self, b: &Storage, isa: Isa) -> Arc<Packing> {
        if self.rhs == RhsSource::Computed {
            return Arc::new(Packing { from: None, isa, packed: pack(b, isa) });
        }
        {
            let mut cached = self.packed.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = cached.entry.as_ref().filter(|p| p.packs(b, isa)) {
                let p = p.clone();
                cached.hits += 1;
                return p;
            }
        }
        let p = shared_packing(b, isa);
        let mut cached = self.packed.lock().unwrap_or_else(|p| p.into_inner());
        let keep = self.rhs == RhsSource::Weight || !cached.stored || cached.hits > 0;
        cached.entry = keep.then(|| p.clone());
        cached.stored |= keep;
        cached.hits = 0;
        p
    }

    /// Whether a packing of the right operand is held now (tests).
    #[cfg(test)]
    pub(crate) fn holds_packing(&self) -> bool {
        self.packed.lock().unwrap_or_else(|p| p.into_inner()).entry.is_some()
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

/// `b` packed for the kernels of `isa` (f32 rounded to nearest even).
fn pack(b: &Storage, isa: Isa) -> PackedBf16 {
    match b {
        Storage::F32(x) => PackedBf16::from_f32_for(x.view().into_dimensionality().expect("rank 2"), isa),
        Storage::BF16(x) => {
            PackedBf16::from_bf16_for(x.view().into_dimensionality::<ndarray::Ix2>().expect("rank 2"), isa)
        }
        other => unreachable!("the bf16_products pass gives f32 or bf16 operands, not {}", other.dtype()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(rows: usize, cols: usize, seed: u64) -> Storage {
        let v: Vec<f32> = (0..rows * cols).map(|i| ((i as u64 * 37 + seed * 101) % 97) as f32 / 97.0 - 0.5).collect();
        Storage::from_vec(v, &[rows, cols]).unwrap()
    }

    /// An argument's packing is reused while the same buffer comes back,
    /// replaced when another one comes (never a stale result), and given
    /// up when new buffers come twice in a row; a weight's is always kept.
    #[test]
    fn an_arguments_packing_is_kept_only_while_it_repeats() {
        let isa = Isa::native();
        let a = matrix(5, 7, 1);
        let fresh =
            |b: &Storage| Bf16Product::new([true, true], RhsSource::Computed).run_with(isa, &a, b, &mut |_, _| None);
        let product = Bf16Product::new([true, true], RhsSource::Argument);
        let run = |b: &Storage| product.run_with(isa, &a, b, &mut |_, _| None);
        let (w1, w2, w3) = (matrix(7, 3, 2), matrix(7, 3, 3), matrix(7, 3, 4));
        assert!(run(&w1).bit_eq(&fresh(&w1)) && product.holds_packing(), "the first call keeps it");
        assert!(run(&w1).bit_eq(&fresh(&w1)) && product.holds_packing(), "the same buffer again");
        // A new buffer after a reuse: packed anew and kept.
        assert!(run(&w2).bit_eq(&fresh(&w2)) && product.holds_packing());
        // A second new buffer in a row: packed, and nothing kept any more.
        assert!(run(&w3).bit_eq(&fresh(&w3)) && !product.holds_packing());
        assert!(run(&w1).bit_eq(&fresh(&w1)) && !product.holds_packing(), "a training loop's pattern keeps nothing");
        let weight = Bf16Product::new([true, true], RhsSource::Weight);
        for w in [&w1, &w2, &w3] {
            assert!(weight.run_with(isa, &a, w, &mut |_, _| None).bit_eq(&fresh(w)) && weight.holds_packing());
        }
        assert!(!Bf16Product::new([true, true], RhsSource::Computed).holds_packing());
    }

    /// Products (of one executable or several) multiplying by one buffer
    /// share its packing (for one Isa), a weight's or an argument's; a
    /// buffer of equal values does not take it, and the packing goes when
    /// the last product moves on.
    #[test]
    fn products_share_a_weights_packing_by_its_buffer() {
        let (isa, a) = (Isa::native(), matrix(5, 7, 1));
        let (w, twin) = (matrix(7, 3, 2), matrix(7, 3, 2));
        let [p, q] = [0, 1].map(|_| Bf16Product::new([true, true], RhsSource::Weight));
        let (pw, qw) = (p.packed_rhs(&w, isa), q.packed_rhs(&w, isa));
        assert!(Arc::ptr_eq(&pw, &qw), "one packing for both products");
        let arg = Bf16Product::new([true, true], RhsSource::Argument);
        assert!(Arc::ptr_eq(&pw, &arg.packed_rhs(&w, isa)), "an argument's product shares it too");
        drop(arg);
        assert!(!Arc::ptr_eq(&pw, &q.packed_rhs(&twin, isa)), "equal values, another buffer");
        assert!(!Arc::ptr_eq(&pw, &p.packed_rhs(&w, Isa::avx2())), "another Isa");
        // Both products have moved on (q to the twin, p to the AVX2
        // packing): only `pw` and `qw` hold the first packing now.
        let weak = Arc::downgrade(&pw);
        drop((pw, qw));
        assert!(weak.upgrade().is_none(), "the packing outlived its products");
        // The shared packing's product has the bits of a fresh one.
        let fresh = Bf16Product::new([true, true], RhsSource::Computed).run_with(isa, &a, &w, &mut |_, _| None);
        let r = Bf16Product::new([true, true], RhsSource::Weight);
        let _hold = p.packed_rhs(&w, isa);
        assert!(r.run_with(isa, &a, &w, &mut |_, _| None).bit_eq(&fresh));
        assert!(Arc::ptr_eq(&_hold, &r.packed_rhs(&w, isa)));
    }
}
