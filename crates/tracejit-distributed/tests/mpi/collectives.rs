//! The collectives between ranks, eagerly and compiled, against results
//! computed locally from every rank's (deterministic) inputs.

use tracejit_distributed::{self as distributed, ReduceOp, World};
use tracejit_trace::{function, DType, Tensor};

use crate::values;

pub fn checks() -> Vec<crate::Check> {
    vec![
        ("eager_all_reduce_matches_the_local_reduction", eager_all_reduce),
        ("eager_broadcast_and_all_gather", eager_broadcast_and_gather),
        ("compiled_collectives_are_kept_and_ordered", compiled_collectives),
        ("misuse_is_an_error_naming_the_rank", misuse),
    ]
}

/// Every rank's inputs, rank by rank.
fn all_inputs(w: World, seed: u64, n: usize) -> Vec<Vec<f64>> {
    (0..w.size()).map(|r| values(r, seed, n)).collect()
}

fn reduce(op: ReduceOp, xs: &[f64]) -> f64 {
    match op {
        ReduceOp::Sum => xs.iter().sum(),
        ReduceOp::Mean => xs.iter().sum::<f64>() / xs.len() as f64,
        ReduceOp::Max => xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Min => xs.iter().copied().fold(f64::INFINITY, f64::min),
    }
}

fn eager_all_reduce(w: World) {
    let n = 7; // odd: no vector width divides it
    let inputs = all_inputs(w, 1, n);
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        // f64 and f32: MPI sums in the element type, in an order of its
        // choosing, so the bound is (size - 1) roundings of the sum of
        // magnitudes (exact for max and min).
        let mine = &inputs[w.rank()];
        let got64 = distributed::all_reduce(&Tensor::from_vec(mine.clone(), &[n]), op).to_vec::<f64>().unwrap();
        let mine32: Vec<f32> = mine.iter().map(|&v| v as f32).collect();
        let got32 = distributed::all_reduce(&Tensor::from_vec(mine32, &[n]), op).to_vec::<f32>().unwrap();
        for i in 0..n {
            let col: Vec<f64> = inputs.iter().map(|x| x[i]).collect();
            let col32: Vec<f64> = col.iter().map(|&v| v as f32 as f64).collect();
            let mag: f64 = col.iter().map(|v| v.abs()).sum();
            let bound = |eps: f64| (w.size() as f64) * eps * mag;
            assert!((got64[i] - reduce(op, &col)).abs() <= bound(f64::EPSILON), "{op:?} f64 element {i}");
            assert!((got32[i] as f64 - reduce(op, &col32)).abs() <= bound(f32::EPSILON as f64), "{op:?} f32 {i}");
        }
    }
    // Integers: exact. Infinity propagates through a sum; bf16 sums in f32.
    let ints = Tensor::from_vec(vec![w.rank() as i64 + 1, -3], &[2]);
    let total: i64 = (1..=w.size() as i64).sum();
    assert_eq!(distributed::all_reduce(&ints, ReduceOp::Sum).to_vec::<i64>().unwrap(), [total, -3 * w.size() as i64]);
    assert_eq!(distributed::all_reduce(&ints, ReduceOp::Max).to_vec::<i64>().unwrap(), [w.size() as i64, -3]);
    let inf = Tensor::from_vec(vec![if w.rank() == 0 { f32::INFINITY } else { 1.0 }, f32::NAN], &[2]);
    let s = distributed::all_reduce(&inf, ReduceOp::Sum).to_vec::<f32>().unwrap();
    assert!(s[0] == f32::INFINITY && s[1].is_nan(), "{s:?}");
    let b = Tensor::from_vec(vec![1.5f32, 2.0], &[2]).cast(DType::BF16);
    let bs = distributed::all_reduce(&b, ReduceOp::Sum);
    assert_eq!(bs.dtype(), DType::BF16);
    let want = 1.5 * w.size() as f32;
    assert_eq!(bs.cast(DType::F32).to_vec::<f32>().unwrap()[0], want);
    let any = Tensor::from_vec(vec![w.rank() == 1, false], &[2]);
    assert_eq!(distributed::all_reduce(&any, ReduceOp::Max).to_vec::<bool>().unwrap(), [true, false]);
}

fn eager_broadcast_and_gather(w: World) {
    for root in 0..w.size() {
        let x = Tensor::from_vec(values(w.rank(), 2, 5), &[5]);
        let got = distributed::broadcast(&x, root).to_vec::<f64>().unwrap();
        assert_eq!(got, values(root, 2, 5), "broadcast from {root}");
    }
    // [2, 3] per rank; gathered along each axis.
    let mine: Vec<f32> = values(w.rank(), 3, 6).iter().map(|&v| v as f32).collect();
    let x = Tensor::from_vec(mine, &[2, 3]);
    let parts: Vec<Tensor> =
        (0..w.size()).map(|r| Tensor::from_vec(values(r, 3, 6).iter().map(|&v| v as f32).collect(), &[2, 3])).collect();
    for axis in 0..2 {
        let got = distributed::all_gather(&x, axis);
        let want = Tensor::concat(&parts, axis as i64);
        assert_eq!(got.shape(), want.shape(), "axis {axis}");
        assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap(), "axis {axis}");
    }
}

/// Counts the collective nodes of a compiled function's optimized graph.
fn collective_nodes(listing: &str) -> usize {
    listing.matches(distributed::NODE_PREFIX).count()
}

fn compiled_collectives(w: World) {
    // Two identical collectives (CSE must not merge them), one whose result
    // is unused (DCE must not drop it: the other ranks wait for it), and one
    // on a constant (constant folding must not run it once at compile time).
    let f = function(|x: Tensor| {
        let a = distributed::all_reduce(&(&x * 2.0), ReduceOp::Sum);
        let b = distributed::all_reduce(&(&x * 2.0), ReduceOp::Sum);
        let _unused = distributed::all_reduce(&x, ReduceOp::Max);
        let c = distributed::all_reduce(&Tensor::scalar(1.0f32), ReduceOp::Sum);
        &a + &b + c
    });
    for call in 0..3 {
        let x = Tensor::from_vec(vec![w.rank() as f32 + call as f32, 1.0], &[2]);
        let y = f.call(x).unwrap().to_vec::<f32>().unwrap();
        let ranks: f32 = (0..w.size()).map(|r| r as f32 + call as f32).sum();
        let n = w.size() as f32;
        assert_eq!(y, [4.0 * ranks + n, 4.0 * n + n], "call {call}");
    }
    assert_eq!(f.tracing_count(), 1);
    let cf = &f.concrete_functions()[0];
    let listing = cf.optimized_graph().to_string();
    assert_eq!(collective_nodes(&listing), 4, "{listing}");
}

fn misuse(w: World) {
    let x = Tensor::from_vec(vec![1i32, 2], &[2]);
    let e = distributed::try_all_reduce(&x, ReduceOp::Mean).unwrap_err().to_string();
    assert!(e.contains(&format!("rank {}", w.rank())) && e.contains("float"), "{e}");
    let e = distributed::try_broadcast(&Tensor::scalar(1.0f32), w.size()).unwrap_err().to_string();
    assert!(e.contains(&format!("rank {}", w.rank())) && e.contains("root"), "{e}");
    // Inside a function the failure is an Err from `call`.
    let f = function(|x: Tensor| distributed::all_reduce(&x, ReduceOp::Mean));
    let e = f.call(Tensor::from_vec(vec![1i64], &[1])).unwrap_err().to_string();
    assert!(e.contains(&format!("rank {}", w.rank())), "{e}");
}
