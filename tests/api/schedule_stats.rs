//! `ConcreteFunction::schedule_stats` counts every kind of step a compiled
//! call runs: GEMMs, fused regions, reference ops, views, variable reads and
//! writes, calls (with their callee's steps) and control flow (with both
//! branches of a `cond`); the counts do not change between calls.

use tracejit::prelude::*;

#[test]
fn every_kind_of_step_is_counted() {
    let v = Variable::new(Tensor::zeros(&[4, 2], DType::F32));
    let inner = function(|x: Tensor| (x.exp() + 1.0).transpose(&[1, 0]).reshape(&[8])).name("inner");
    let (v2, inner2) = (v.clone(), inner.clone());
    let f = function(move |(x, w, flag): (Tensor, Tensor, Tensor)| {
        let h = (x.matmul(&w) + 1.0).relu(); // a GEMM, then a region
        v2.assign_add(&h); // a read and a write
                           // Inlined: exp + 1 joins the region, a transpose (a view), a reshape
                           // (a reference op: it copies the transposed view).
        let t = inner2.call(h.clone()).unwrap();
        let picked = tracejit::cond(&flag, || &t * 2.0, || &t - 1.0); // one region per branch
        (picked, v2.read())
    });
    let args = |flag: bool| (Tensor::randn(&[4, 3], 0), Tensor::randn(&[3, 2], 1), Tensor::scalar(flag));
    f.call(args(true)).unwrap();
    let cf = f.concrete_functions()[0].clone();
    let st = cf.schedule_stats().expect("the JIT runs it");
    assert_eq!((st.gemms, st.regions, st.fallbacks, st.native_kernels), (1, 3, 1, 0), "{st}");
    assert_eq!(cf.fallbacks(), ["reshape"]);
    assert_eq!(st.views, 1, "{st}");
    assert_eq!((st.reads, st.writes, st.calls, st.control_flow), (1, 1, 0, 1), "{st}");
    assert_eq!(st.kernels(), 5);
    let text = st.to_string();
    assert!(
        text.starts_with("5 kernels: 3 fused regions, 1 GEMMs (0 bf16), 0 native kernels, 1 reference ops"),
        "{text}"
    );

    f.call(args(false)).unwrap();
    assert_eq!(f.tracing_count(), 1);
    assert_eq!(f.concrete_functions()[0].schedule_stats(), Some(st), "a fixed schedule");

    // Unoptimized, the call stays a call; the callee's steps count.
    let outer = function(move |x: Tensor| inner.call(x).unwrap()).optimize(false);
    outer.call(Tensor::randn(&[4, 2], 3)).unwrap();
    let st = outer.concrete_functions()[0].schedule_stats().unwrap();
    assert_eq!((st.calls, st.regions, st.fallbacks, st.views), (1, 1, 1, 1), "{st}");

    // The interpreter runs a function compiled without the JIT: no stats.
    let g = function(|x: Tensor| x.exp()).jit(false);
    g.call(Tensor::randn(&[3], 2)).unwrap();
    assert_eq!(g.concrete_functions()[0].schedule_stats(), None);
}
