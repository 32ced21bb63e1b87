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
//! pass decides which products pair (`codegen/products.rs`).

use std::sync::Mutex;

use tracejit_ir::tensor::Storage;

use crate::region::BufPool;

/// `a[0]·b[0]` and `a[1]·b[1]` on two threads of the pool, each product
/// on one (as on one thread), outputs from `pool`; `None` when the pool
/// has one thread.
pub(super) fn run_pair(
    isa: tracejit_kernels::Isa,
    a: [&Storage; 2],
    b: [&Storage; 2],
    pool: &mut BufPool,
) -> Option<[Storage; 2]> {
    let threads = crate::threads::pool()?;
    let mut out_buf = |t: usize| {
        let (sa, sb) = (a[t].shape(), b[t].shape());
        pool.take(a[t].dtype(), &[sa[0], sb[1]])
    };
    let bufs = [Mutex::new(out_buf(0)), Mutex::new(out_buf(1))];
    let outs: [Mutex<Option<Storage>>; 2] = Default::default();
    threads.run(2, &|t| {
        let mut buf = bufs[t].lock().unwrap_or_else(|e| e.into_inner()).take();
        let r = crate::threads::serial(|| crate::gemm::matmul_with(isa, a[t], b[t], &mut |_, _| buf.take()));
        *outs[t].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    });
    let [x, y] = outs.map(|o| o.into_inner().unwrap_or_else(|e| e.into_inner()).expect("both products ran"));
    Some([x, y])
}
