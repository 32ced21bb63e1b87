//! `tracejit::config::set_num_threads` through traced functions: the
//! workloads' kernels give the same bits with 1, 2 and 3 threads (and the
//! eager results within the usual tolerance), and W1-sized calls never
//! enter the pool. The count is process-wide, so the tests take turns.

use std::sync::{Mutex, MutexGuard};

#[allow(dead_code, reason = "the helpers serve several test binaries; this one uses `run_child`")]
mod common;

use tracejit::config::{num_threads, pool_dispatches, set_num_threads};
use tracejit::prelude::*;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
}

/// Calls `f` with 1, 2 and 3 threads; the results must agree bit for bit.
/// Returns the 1-thread result.
fn same_with_each_count<A: Nest + Clone>(f: &Function<A, Tensor>, args: A) -> Tensor {
    set_num_threads(1);
    let one = f.call(args.clone()).unwrap();
    for t in [2, 3] {
        set_num_threads(t);
        assert_eq!(num_threads(), t);
        let got = f.call(args.clone()).unwrap();
        assert!(bits(&got) == bits(&one), "{t} threads give other bits than 1");
    }
    set_num_threads(1);
    one
}

fn assert_close(got: &Tensor, want: &Tensor, tol: f32) {
    let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    assert_eq!(g.len(), w.len());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= tol * (1.0 + b.abs()), "element {i}: {a} vs eager {b}");
    }
}

#[test]
fn w1_sized_calls_never_enter_the_pool() {
    let _s = serial();
    let f = function(|x: Tensor| {
        let mut x = x;
        for _ in 0..50 {
            x = &x * 1.0001 + 0.001;
        }
        x
    });
    let x = Tensor::randn(&[16], 1);
    set_num_threads(2);
    f.call(x.clone()).unwrap();
    let before = pool_dispatches();
    for _ in 0..100 {
        f.call(x.clone()).unwrap();
    }
    assert_eq!(pool_dispatches(), before);
    set_num_threads(1);
}

#[test]
fn softmax_gelu_and_layernorm_give_the_same_bits_with_any_count() {
    let _s = serial();
    let softmax = function(|x: Tensor| {
        let e = (&x - &x.max(&[-1], true)).exp();
        &e / &e.sum(&[-1], true)
    });
    let x = Tensor::randn(&[301, 1023], 2);
    let got = same_with_each_count(&softmax, x.clone());
    let e = (&x - &x.max(&[-1], true)).exp();
    assert_close(&got, &(&e / &e.sum(&[-1], true)), 1e-5);

    let gelu = function(|x: Tensor| 0.5 * &x * (((&x + 0.044715 * (&x * &x * &x)) * 0.7978845608).tanh() + 1.0));
    let x = Tensor::randn(&[100_003], 3);
    let got = same_with_each_count(&gelu, x.clone());
    assert_close(&got, &(0.5 * &x * (((&x + 0.044715 * (&x * &x * &x)) * 0.7978845608).tanh() + 1.0)), 1e-5);

    let layernorm = function(|(x, gamma): (Tensor, Tensor)| {
        let xc = &x - &x.mean(&[-1], true);
        let var = (&xc * &xc).mean(&[-1], true);
        &xc * (var + 1e-5).rsqrt() * &gamma
    });
    let gamma = Tensor::randn(&[1024], 5);
    let got = same_with_each_count(&layernorm, (Tensor::randn(&[257, 1024], 4), gamma));
    assert_eq!(got.dims(), [Some(257), Some(1024)]);
}

/// Dropout's kernel draws its chunks of uniforms over the pool: the bits
/// of its body (the uniforms as one tensor) at any count, eager and
/// compiled, on a size that ends in a short chunk.
#[test]
fn dropout_gives_its_bodys_bits_with_any_count() {
    let _s = serial();
    let x = Tensor::randn(&[301, 1023], 6);
    let dropout = |body: bool| {
        let g = tracejit::random::Generator::from_seed(9);
        function(move |x: Tensor| tracejit::nn::dropout(&x, 0.1, &g, true)).selector(!body)
    };
    set_num_threads(1);
    let want = bits(&dropout(true).call(x.clone()).unwrap());
    for t in [1, 2, 3] {
        set_num_threads(t);
        let before = pool_dispatches();
        let got = dropout(false).call(x.clone()).unwrap();
        assert!(t == 1 || pool_dispatches() > before, "{t} threads: the kernel did not enter the pool");
        assert!(bits(&got) == want, "{t} threads: the kernel differs from the body");
        let eager = tracejit::nn::dropout(&x, 0.1, &tracejit::random::Generator::from_seed(9), true);
        assert!(bits(&eager) == want, "{t} threads, eager");
    }
    set_num_threads(1);
}

#[test]
fn mlp_and_lstm_give_the_same_bits_with_any_count() {
    let _s = serial();
    let mlp = function(|(x, w1, b1, w2): (Tensor, Tensor, Tensor, Tensor)| {
        let h = (x.matmul(&w1) + &b1).relu();
        let y = h.matmul(&w2);
        // A column reduction (a bias gradient's shape) over the batch.
        y.sum(&[0], false)
    });
    let args = (
        Tensor::randn(&[64, 784], 6),
        Tensor::randn(&[784, 512], 7),
        Tensor::randn(&[512], 8),
        Tensor::randn(&[512, 500], 9),
    );
    let got = same_with_each_count(&mlp, args.clone());
    let (x, w1, b1, w2) = args;
    assert_close(&got, &(x.matmul(&w1) + &b1).relu().matmul(&w2).sum(&[0], false), 1e-3);

    // W7's composite kernel (its GEMMs use the pool past the GEMM threshold).
    let lstm = function(|(x, h, c, w_ih, w_hh, b): (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)| {
        let (h2, c2) = tracejit::nn::lstm_cell(&x, &h, &c, &w_ih, &w_hh, &b);
        h2 + c2
    });
    let args = (
        Tensor::randn(&[64, 256], 10),
        Tensor::randn(&[64, 256], 11),
        Tensor::randn(&[64, 256], 12),
        Tensor::randn(&[256, 1024], 13) * 0.05,
        Tensor::randn(&[256, 1024], 14) * 0.05,
        Tensor::randn(&[1024], 15),
    );
    same_with_each_count(&lstm, args);
}

/// The OS threads of this process now (Linux; `None` elsewhere).
fn os_threads() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|n| n.trim().parse().ok())
}

/// The child of `huge_thread_counts_are_clamped`: a count of 1,000 started
/// 1,001 OS threads, and `usize::MAX` aborted the process after ~16k.
#[test]
fn child_huge_thread_counts() {
    if std::env::var_os("TRACEJIT_THREADS_CHILD").is_none() {
        return;
    }
    let max = tracejit::config::max_threads();
    let product = function(|(a, b): (Tensor, Tensor)| a.matmul(&b));
    let (a, b) = (Tensor::randn(&[512, 512], 1), Tensor::randn(&[512, 512], 2));
    let before = os_threads();
    for n in [1000, usize::MAX] {
        assert_eq!(set_num_threads(n), max);
        assert_eq!(num_threads(), max);
        // A product this large runs on the pool.
        product.call((a.clone(), b.clone())).unwrap();
    }
    if let (Some(before), Some(after)) = (before, os_threads()) {
        assert!(
            after <= before + max,
            "{after} threads after asking for 1000, {before} before (at most {max} allowed)"
        );
    }
    eprintln!("child done");
}

#[test]
fn huge_thread_counts_are_clamped() {
    if std::env::var_os("TRACEJIT_THREADS_CHILD").is_some() {
        return;
    }
    let (status, stderr) = common::run_child(
        "child_huge_thread_counts",
        &[("TRACEJIT_THREADS_CHILD", "1")],
        std::time::Duration::from_secs(120),
    );
    assert!(status.is_some_and(|s| s.success()) && stderr.contains("child done"), "{status:?}\n{stderr}");
}
