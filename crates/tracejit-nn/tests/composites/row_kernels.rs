//! The row kernels (softmax, log-softmax, layer norm) on inputs large
//! enough to run in parts on the pool (`per_row` over `par::collect`):
//! against the body, with NaN and infinite rows among them and rows of odd
//! lengths, the work split at 2 and 3 threads, and the same bits at 1, 2
//! and 3 threads (each row is computed alone).

use tracejit_kernels::threads::pool_dispatches;
use tracejit_kernels::{Isa, Target};
use tracejit_nn::composite;
use tracejit_tensor::Storage;
use tracejit_trace::{DType, Tensor};

/// `[rows, n]` values with a NaN, an infinity of each sign in other rows.
fn input(rows: usize, n: usize, seed: u64) -> Tensor {
    let mut v = Tensor::randn(&[rows, n], seed).to_vec::<f32>().unwrap();
    v[n + 3] = f32::NAN;
    v[5 * n + 1] = f32::INFINITY;
    v[(rows - 2) * n] = f32::NEG_INFINITY;
    Tensor::from_vec(v, &[rows, n])
}

/// `name`'s kernel on `inputs` against its body, and at 2 and 3 threads
/// split over the pool with the one-thread bits; returns the one-thread
/// result.
fn check(name: &str, inputs: &[Tensor]) -> Vec<f32> {
    let c = tracejit_nn::declared().iter().find(|c| c.name() == name).expect("declared");
    let native = c.native().expect("a native kernel");
    let shape = inputs[0].shape().to_vec();
    let expected = c.run_body(inputs, 0);
    let values: Vec<Storage> = inputs.iter().map(|t| t.storage().expect("eager").clone()).collect();
    // The result at `threads` threads, and whether the pool ran parts of it.
    let run = |threads: usize| -> (Vec<Tensor>, bool) {
        Target::host().with_threads(threads).enter(|| {
            let before = pool_dispatches();
            let out = (native.run)(&values, Isa::native()).into_iter().map(Tensor::from_raw_storage).collect();
            (out, pool_dispatches() > before)
        })
    };
    let (one, _) = run(1);
    composite::compare_outputs(inputs, &expected, &one).unwrap_or_else(|d| panic!("{name} {shape:?}: {d}"));
    let bits = |t: &[Tensor]| -> Vec<u32> { t[0].to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect() };
    for threads in [2, 3] {
        let (many, split) = run(threads);
        assert!(split, "{name} {shape:?}: {threads} threads did not split the rows");
        assert!(bits(&one) == bits(&many), "{name} {shape:?}: bits differ at {threads} threads");
    }
    one[0].to_vec::<f32>().unwrap()
}

#[test]
fn large_row_kernels_match_their_bodies_at_any_thread_count() {
    // 300 rows of 257 and 600 of 128: above the pool's 65,536 values,
    // parts of whole rows.
    for (rows, n) in [(300usize, 257usize), (600, 128)] {
        let x = input(rows, n, rows as u64);
        for name in ["tracejit.nn.softmax", "tracejit.nn.log_softmax"] {
            let y = check(name, std::slice::from_ref(&x));
            // The NaN row is NaN throughout; a plain row is finite.
            assert!(y[n..2 * n].iter().all(|v| v.is_nan()), "{name}: the NaN row");
            assert!(y[2 * n..3 * n].iter().all(|v| v.is_finite()), "{name}: a plain row");
        }
        let (gamma, beta) = (Tensor::randn(&[n], 7), Tensor::randn(&[n], 8));
        let y = check("tracejit.nn.layer_norm", &[x, gamma, beta, Tensor::full(&[], 1e-5, DType::F32)]);
        assert!(y[n..2 * n].iter().all(|v| v.is_nan()), "layer_norm: the NaN row");
    }
}

#[test]
fn an_empty_input_and_rows_of_zero_length_give_empty_outputs() {
    let c = tracejit_nn::declared().iter().find(|c| c.name() == "tracejit.nn.softmax").expect("declared");
    let native = c.native().expect("a native kernel");
    for shape in [&[0usize, 4][..], &[3, 0]] {
        let x = Storage::from_vec(Vec::<f32>::new(), shape).unwrap();
        let y = (native.run)(&[x], Isa::native());
        assert_eq!(y[0].shape(), shape);
    }
}
