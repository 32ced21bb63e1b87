//! A whole function run for another CPU in the same process
//! (`Function::target`): the AVX2 code of an AMD Zen 3 beside the host's
//! own (AVX-512 on these machines), compiled by the JIT for each, its
//! kernels keyed by the target, the results within the error bound of the
//! two summation orders.

use tracejit::prelude::*;
use tracejit::Target;

/// `softmax(tanh(x @ w))` over rows, and its column sums.
fn block(x: Tensor, w: Tensor) -> (Tensor, Tensor) {
    let p = tracejit::nn::softmax(&x.matmul(&w).tanh(), -1);
    let s = p.sum(&[0], false);
    (p, s)
}

/// Uniform in [-1, 1): the bound below assumes nothing more.
fn uniform(shape: &[usize], seed: u64) -> Tensor {
    Tensor::rand_uniform(shape, -1.0, 1.0, seed)
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).to_vec::<f64>().unwrap()
}

#[test]
fn a_function_runs_as_an_avx2_machine_runs_it_beside_the_hosts_code() {
    let (m, k, n) = (37, 64, 29);
    let (x, w) = (uniform(&[m, k], 1), uniform(&[k, n], 2));
    let native = function(|(x, w): (Tensor, Tensor)| block(x, w)).name("native");
    let zen3 = function(|(x, w): (Tensor, Tensor)| block(x, w)).name("zen3").target(Target::avx2());
    let (p1, s1) = native.call((x.clone(), w.clone())).unwrap();
    let (p2, s2) = zen3.call((x.clone(), w.clone())).unwrap();

    // Both ran compiled code, built for their own targets.
    let (cn, cz) = (&native.concrete_functions()[0], &zen3.concrete_functions()[0]);
    assert_eq!(cn.jit_error(), None);
    assert_eq!(cz.jit_error(), None);
    assert_eq!(cz.target(), Some(Target::avx2()));
    let (en, ez) = (cn.kernel_entries(), cz.kernel_entries());
    assert!(!en.is_empty() && !ez.is_empty(), "the JIT compiled no kernel");
    // The AVX2 kernels are this process's code only under the AVX2 target
    // (on an AVX-512 host; on an AVX2 host both targets are the host's).
    let host_avx512 = std::is_x86_feature_detected!("avx512f") && Target::host().isa.avx512_allowed();
    for e in &ez {
        let outside = tracejit_jit::compile_cache::preload_entry(e).unwrap();
        assert_eq!(outside.is_some(), host_avx512, "{outside:?}");
        let inside = Target::avx2().enter(|| tracejit_jit::compile_cache::preload_entry(e).unwrap());
        assert_eq!(inside, None);
    }

    // Error bound: each product element is within γ_k·(|x||w|)ᵢⱼ of the
    // exact one in either order (γ_k = 1.01·k·2⁻²⁴), so the two differ by
    // at most twice that; tanh is 1-Lipschitz and computes the same bits
    // for the same input in either width (plus 4 ulp of slack for inputs
    // that differ). Softmax: inputs off by δ change pᵢ by a factor within
    // e^{±2δ}, and the row sums' orders by 2γ_n; the column sums add
    // 2γ_m·Σ|p| to the propagated error.
    let unit = 2f64.powi(-24);
    let scale = x.abs().cast(DType::F64).matmul(&w.abs().cast(DType::F64));
    let delta: f64 = f64s(&scale).iter().map(|s| 2.0 * 1.01 * k as f64 * unit * s).fold(0.0, f64::max) + 8.0 * unit;
    let (a, b) = (f64s(&p1), f64s(&p2));
    let rel = (2.01 * delta).exp_m1() + 2.0 * 1.01 * n as f64 * unit + 8.0 * unit;
    let mut col_err = vec![0.0f64; n];
    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
        let tol = rel * a.abs().max(b.abs());
        assert!((a - b).abs() <= tol, "p[{i}]: {a} vs {b} (tol {tol})");
        col_err[i % n] += tol;
    }
    let (sa, sb) = (f64s(&s1), f64s(&s2));
    for (j, (a, b)) in sa.iter().zip(&sb).enumerate() {
        let tol = col_err[j] + 2.0 * 1.01 * m as f64 * unit * a.abs().max(*b) + 8.0 * unit;
        assert!((a - b).abs() <= tol, "s[{j}]: {a} vs {b} (tol {tol})");
    }
}

#[test]
fn a_targets_thread_count_holds_for_every_call_and_changes_no_bit() {
    let x = uniform(&[300, 700], 3);
    let f = |x: Tensor| (x.tanh() * 3.0 + &x).exp().sum(&[1], false);
    let one = function(f).name("one").target(Target::host().with_threads(1));
    let two = function(f).name("two").target(Target::host().with_threads(2).with_split_threshold(1));
    // The dispatch counter is this thread's: other tests do not move it.
    let dispatches = tracejit_jit::threads::pool_dispatches;
    let before = dispatches();
    let a = one.call(x.clone()).unwrap();
    assert_eq!(dispatches(), before, "a one-thread target entered the pool");
    let b = two.call(x).unwrap();
    assert!(dispatches() > before, "a two-thread target with split threshold 1 did not split");
    assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap(), "bits differ with the thread count");
    assert_eq!(one.concrete_functions()[0].target().unwrap().threads, Some(1));
}
