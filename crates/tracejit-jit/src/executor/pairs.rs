//! Two independent matrix products run side by side, one per thread,
//! instead of one after the other, each cut into blocks across all
//! threads.
//!
//! Why: a backward pass computes a layer's weight gradient `xᵀ·dy` and its
//! input gradient `dy·wᵀ` from the same `dy`, and neither needs the other.
//! Cut into output blocks, a product of W6's sizes gains 1.3-1.5x from a
//! second thread (each block packs the shared operand again and the
//! blocks are few); two whole products on two threads gain nearly 2x. The
//! products run exactly as on one thread (`threads::serial`), so results
//! keep their bits whatever the thread count. The `side_by_side` codegen
//! pass decides which products pair (`codegen/products.rs`), f32 and bf16
//! products alike (the bf16 GEMM's bits do not depend on its threads
//! either).

use std::sync::Mutex;

use tracejit_ir::tensor::{DType, Storage};

use crate::gemm_bf16::Bf16Product;
use crate::region::BufPool;

/// Which GEMM a paired product runs on.
#[derive(Clone, Copy)]
pub(super) enum Gemm<'a> {
    /// The f32 (or f64) GEMM.
    Plain,
    /// The bf16 GEMM of a `matmul_bf16` step.
    Bf16(&'a Bf16Product),
}

/// `a[0]·b[0]` and `a[1]·b[1]` on two threads of the pool, each product
/// on one (as on one thread) with its own GEMM, outputs from `pool`;
/// `None` when the pool has one thread.
pub(super) fn run_pair(
    isa: tracejit_kernels::Isa,
    gemms: [Gemm<'_>; 2],
    a: [&Storage; 2],
    b: [&Storage; 2],
    pool: &mut BufPool,
) -> Option<[Storage; 2]> {
    let threads = crate::threads::pool()?;
    let mut out_buf = |t: usize| {
        let (sa, sb) = (a[t].shape(), b[t].shape());
        let dtype = match gemms[t] {
            Gemm::Plain => a[t].dtype(),
            Gemm::Bf16(_) => DType::F32,
        };
        // The bf16 GEMM takes a stack of rows as one product.
        let mut shape = sa.to_vec();
        *shape.last_mut()? = *sb.last()?;
        pool.take(dtype, &shape)
    };
    let bufs = [Mutex::new(out_buf(0)), Mutex::new(out_buf(1))];
    let outs: [Mutex<Option<Storage>>; 2] = Default::default();
    threads.run(2, &|t| {
        let mut buf = bufs[t].lock().unwrap_or_else(|e| e.into_inner()).take();
        let mut take = |_: DType, _: &[usize]| buf.take();
        let r = crate::threads::serial(|| match gemms[t] {
            Gemm::Plain => crate::gemm::matmul_with(isa, a[t], b[t], &mut take),
            Gemm::Bf16(p) => p.run_with(isa, a[t], b[t], &mut take),
        });
        *outs[t].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    });
    let [x, y] = outs.map(|o| o.into_inner().unwrap_or_else(|e| e.into_inner()).expect("both products ran"));
    Some([x, y])
}
