//! The indexing, window and scan primitives of the third milestone,
//! exported and run in tract against tracejit's own results: scatter_add
//! (ScatterElements with reduction add), gather_elements, dynamic_slice
//! and dynamic_update_slice at clamped starts, pad, cumsum and top_k.

use crate::common;

use tracejit_tensor::DType;
use tracejit_trace::{function, Tensor, TensorSpec};

fn spec(t: &Tensor) -> TensorSpec {
    let dims: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    TensorSpec::new(t.dtype(), &dims)
}

/// Exports `f` for `inputs` and compares tract's results with tracejit's.
fn check(name: &str, f: impl Fn(Vec<Tensor>) -> Vec<Tensor> + Send + Sync + 'static, inputs: Vec<Tensor>) {
    let specs: Vec<TensorSpec> = inputs.iter().map(spec).collect();
    let cf = function(f).name(name).get_concrete_function(specs).unwrap();
    common::check(name, &cf, &inputs, 1e-5);
}

/// As [`check`] with the first input's leading dim unknown.
fn check_unknown_rows(name: &str, f: impl Fn(Vec<Tensor>) -> Vec<Tensor> + Send + Sync + 'static, inputs: Vec<Tensor>) {
    let mut specs: Vec<TensorSpec> = inputs.iter().map(spec).collect();
    let mut dims: Vec<i64> = inputs[0].shape().iter().map(|&d| d as i64).collect();
    dims[0] = -1;
    specs[0] = TensorSpec::new(inputs[0].dtype(), &dims);
    let cf = function(f).name(name).get_concrete_function(specs).unwrap();
    common::check(name, &cf, &inputs, 1e-5);
}

#[test]
fn scatter_and_gather_elements() {
    let x = Tensor::randn(&[4, 3], 1);
    let idx = Tensor::from_vec(vec![3i64, 0, 2, 0, 0, 1], &[2, 3]);
    let upd = Tensor::randn(&[2, 3], 2);
    check("scatter_add", |a| vec![a[0].scatter_add(0, &a[1], &a[2])], vec![x.clone(), idx.clone(), upd]);
    // Row ids as a column, broadcast against the rows they add.
    let rows = Tensor::randn(&[3, 3], 3);
    let col = Tensor::from_vec(vec![1i64, 1, 3], &[3, 1]);
    check("scatter_add_rows", |a| vec![a[0].scatter_add(0, &a[1], &a[2])], vec![x.clone(), col, rows]);
    check("gather_elements", |a| vec![a[0].gather_elements(0, &a[1])], vec![x, idx]);
}

#[test]
fn windows_pad_cumsum_and_top_k() {
    let x = Tensor::randn(&[3, 5], 4);
    for (i, starts) in [vec![1i64, 2], vec![7, -3], vec![0, 4]].into_iter().enumerate() {
        let s = Tensor::from_vec(starts, &[2]);
        check(&format!("dynamic_slice_{i}"), |a| vec![a[0].dynamic_slice(&a[1], &[2, 3])], vec![x.clone(), s.clone()]);
        let u = Tensor::randn(&[2, 2], 5);
        check(
            &format!("dynamic_update_slice_{i}"),
            |a| vec![a[0].dynamic_update_slice(&a[2], &a[1])],
            vec![x.clone(), s.clone(), u.clone()],
        );
        check_unknown_rows(
            &format!("dynamic_windows_unknown_rows_{i}"),
            |a| vec![a[0].dynamic_slice(&a[1], &[2, 3]), a[0].dynamic_update_slice(&a[2], &a[1])],
            vec![x.clone(), s, u],
        );
    }
    check("pad", |a| vec![a[0].pad(&[(1, 0), (2, 3)], -1.5)], vec![x.clone()]);
    check("cumsum", |a| vec![a[0].cumsum(1), a[0].cumsum(0)], vec![x.clone()]);
    check(
        "top_k",
        |a| {
            let (v, i) = a[0].top_k(2);
            vec![v, i]
        },
        vec![x.clone()],
    );
    let ints = Tensor::from_vec((0..15i32).map(|v| v * 7 % 11).collect(), &[3, 5]);
    check("cumsum_i32", |a| vec![a[0].cumsum(1)], vec![ints.cast(DType::I32)]);
}
