//! Plain SGD on an embedding's gradient inside a compiled step updates
//! only the rows the ids name, in the table's own buffer: the IR's
//! `sparse_update` pass turns `assign(w, w - lr · scatter_add(0, ids,
//! rows))` into `assign_sub`, and the JIT's `sparse_updates` pass runs that
//! as one in-place step (`ScheduleStats::sparse_updates`). The tables are
//! the eager optimizer's bit for bit, on random sizes (vocabularies of 1,
//! 3, 5 and past the constant-folding limit, 0 to 5 ids with duplicates,
//! rows of 0, 1 and 3), with a constant rate and with a schedule.

use proptest::prelude::*;
use tracejit::ir::tensor::with_array;
use tracejit::optim::{Adam, LearningRate, Optimizer, Sgd};
use tracejit::prelude::*;

/// `loss = sum(embedding(table, ids) · target)` and one step of `opt`.
fn step_fn(table: &Variable, opt: impl Optimizer + 'static) -> Function<(Tensor, Tensor), Tensor> {
    let t = table.clone();
    function(move |(ids, target): (Tensor, Tensor)| {
        let tape = GradientTape::new();
        let loss = (tracejit::nn::embedding(&t.read(), &ids) * &target).sum_all();
        let g = tape.gradient(&loss, &[&t]).unwrap().remove(0).unwrap();
        opt.apply_gradients(&[g], std::slice::from_ref(&t));
        loss
    })
}

/// The same step run eagerly.
fn eager_step(table: &Variable, opt: &dyn Optimizer, ids: &Tensor, target: &Tensor) {
    let tape = GradientTape::new();
    let loss = (tracejit::nn::embedding(&table.read(), ids) * target).sum_all();
    let g = tape.gradient(&loss, &[table]).unwrap().remove(0).unwrap();
    opt.apply_gradients(&[g], std::slice::from_ref(table));
}

fn bits(v: &Variable) -> Vec<u32> {
    v.value().to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
}

fn address(v: &Variable) -> usize {
    with_array!(v.value().storage().unwrap(), a => a.as_ptr() as usize)
}

fn ids_and_target(vocab: usize, n: usize, d: usize, seed: u64) -> (Tensor, Tensor) {
    // Duplicates on purpose: ids drawn from the first half of the table.
    let ids: Vec<i64> = (0..n as u64).map(|k| ((seed + 7 * k) % vocab.div_ceil(2) as u64) as i64).collect();
    (Tensor::from_vec(ids, &[n]), Tensor::randn(&[n, d], seed + 1))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn sgd_updates_the_named_rows_in_place_as_eager_does(
        vocab in prop::sample::select(vec![1usize, 3, 5, 1500]),
        n in 0usize..=5,
        d in prop::sample::select(vec![0usize, 1, 3]),
        scheduled in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let lr = if scheduled {
            LearningRate::ExponentialDecay { initial: 0.5, rate: 0.9, steps: 1.0, staircase: false }
        } else {
            LearningRate::Constant(0.25)
        };
        let (traced, eager) = (Variable::new(Tensor::randn(&[vocab, d], seed)), Variable::new(Tensor::randn(&[vocab, d], seed)));
        let step = step_fn(&traced, Sgd::new(lr.clone()));
        let opt = Sgd::new(lr);
        for k in 0..3 {
            let (ids, target) = ids_and_target(vocab, n, d, seed + 10 * k);
            step.call((ids.clone(), target.clone())).unwrap();
            eager_step(&eager, &opt, &ids, &target);
            prop_assert_eq!(bits(&traced), bits(&eager), "step {}", k);
        }
        prop_assert_eq!(step.tracing_count(), 1);
        let cf = &step.concrete_functions()[0];
        let stats = cf.schedule_stats().expect("the JIT runs the step");
        prop_assert_eq!(stats.sparse_updates, 1, "{}\n{}", stats, cf.optimized_graph());
    }
}

#[test]
fn the_tables_buffer_is_updated_where_it_is_and_snapshots_are_kept() {
    let table = Variable::new(Tensor::randn(&[4000, 16], 3));
    let step = step_fn(&table, Sgd::new(0.1));
    let (ids, target) = ids_and_target(4000, 64, 16, 5);
    step.call((ids.clone(), target.clone())).unwrap();
    let at = address(&table);
    step.call((ids.clone(), target.clone())).unwrap();
    assert_eq!(address(&table), at, "the update wrote into the table's own buffer");
    // A value the caller holds is a snapshot: the next step copies first.
    let before = table.value();
    let old = before.to_vec::<f32>().unwrap();
    step.call((ids.clone(), target.clone())).unwrap();
    assert_eq!(before.to_vec::<f32>().unwrap(), old);
    assert_ne!(table.value().to_vec::<f32>().unwrap(), old);
    // The profile shows one sparse step and no scatter into a zero table.
    let profile = step.concrete_functions()[0].profile(&[ids, target], 1).unwrap().expect("compiled");
    assert_eq!(profile.steps.iter().filter(|s| s.kind == "sparse_update").count(), 1, "{profile}");
    assert!(!profile.to_string().contains("scatter_add"), "{profile}");
}

#[test]
fn dense_optimizers_and_a_second_reader_keep_the_dense_update() {
    // Adam's moments change every row: nothing is sparse.
    let table = Variable::new(Tensor::randn(&[6, 2], 1));
    let step = step_fn(&table, Adam::new(0.01));
    let (ids, target) = ids_and_target(6, 3, 2, 2);
    step.call((ids, target)).unwrap();
    assert_eq!(step.concrete_functions()[0].schedule_stats().unwrap().sparse_updates, 0);
    // The gradient also returned: the scatter is needed whole.
    let t = Variable::new(Tensor::randn(&[6, 2], 1));
    let (tt, opt) = (t.clone(), Sgd::new(0.1));
    let f = function(move |(ids, target): (Tensor, Tensor)| {
        let tape = GradientTape::new();
        let loss = (tracejit::nn::embedding(&tt.read(), &ids) * &target).sum_all();
        let g = tape.gradient(&loss, &[&tt]).unwrap().remove(0).unwrap();
        opt.apply_gradients(std::slice::from_ref(&g), std::slice::from_ref(&tt));
        g
    });
    let (ids, target) = ids_and_target(6, 3, 2, 4);
    let before = t.value().to_vec::<f32>().unwrap();
    let g = f.call((ids, target)).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(f.concrete_functions()[0].schedule_stats().unwrap().sparse_updates, 0);
    let after = t.value().to_vec::<f32>().unwrap();
    for ((a, b), g) in after.iter().zip(&before).zip(&g) {
        assert_eq!(*a, b - g * 0.1f32);
    }
}

#[test]
fn a_bad_id_is_an_error_and_the_table_is_unchanged() {
    // `assign_sub` of a scatter into zeros, written by hand: the sparse
    // step checks every id before it writes.
    let table = Variable::new(Tensor::randn(&[5, 3], 1));
    let t = table.clone();
    let f = function(move |(ids, rows): (Tensor, Tensor)| {
        t.assign_sub(&Tensor::zeros(&[5, 3], DType::F32).scatter_add(0, &ids.reshape(&[-1, 1]), &rows));
    });
    let rows = Tensor::ones(&[3, 3], DType::F32);
    f.call((Tensor::from_vec(vec![0i64, 4, 4], &[3]), rows.clone())).unwrap();
    assert_eq!(f.concrete_functions()[0].schedule_stats().unwrap().sparse_updates, 1);
    let good = table.value().to_vec::<f32>().unwrap();
    let e = f.call((Tensor::from_vec(vec![1i64, 2, 5], &[3]), rows)).unwrap_err().to_string();
    assert!(e.contains("index 5 is out of range for axis 0 of size 5"), "{e}");
    assert_eq!(table.value().to_vec::<f32>().unwrap(), good, "nothing was written");
}
