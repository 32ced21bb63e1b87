//! An optimizer update compiled inside a function is one fused region per
//! variable: each region reads one gradient and the variable's slots, and
//! its outputs go straight into the variable and slot assignments (plain
//! `assign`s of the new values: the `w - lr · u` is inside the region), with
//! no temporary of the variable's size in between. (Variables of at most one
//! element are the exception: the fusion planner leaves one-element work to
//! the scalar reference ops.) Checked on the optimized
//! graph and through `ConcreteFunction::schedule_stats`, for SGD (plain,
//! momentum, Nesterov, weight decay) and Adam (plain, AdamW decay,
//! AMSGrad), on random shapes with sizes 0, 1, 3 and 5; the compiled
//! updates match eager ones.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use tracejit::ir::{AssignKind, Graph, NodeId, Op};
use tracejit::optim::{Adam, Optimizer, Sgd};
use tracejit::prelude::*;

/// An optimizer configuration, and how many slots it keeps per variable.
#[derive(Clone, Copy, Debug)]
enum Config {
    Sgd,
    Momentum,
    Nesterov,
    SgdDecay,
    Adam,
    AdamW,
    AmsGrad,
}

const CONFIGS: [Config; 7] =
    [Config::Sgd, Config::Momentum, Config::Nesterov, Config::SgdDecay, Config::Adam, Config::AdamW, Config::AmsGrad];

impl Config {
    fn build(self) -> Box<dyn Optimizer> {
        match self {
            Config::Sgd => Box::new(Sgd::new(0.1)),
            Config::Momentum => Box::new(Sgd::new(0.1).momentum(0.9)),
            Config::Nesterov => Box::new(Sgd::new(0.1).momentum(0.9).nesterov(true)),
            Config::SgdDecay => Box::new(Sgd::new(0.1).momentum(0.5).weight_decay(0.01)),
            Config::Adam => Box::new(Adam::new(0.01)),
            Config::AdamW => Box::new(Adam::new(0.01).weight_decay(0.1)),
            Config::AmsGrad => Box::new(Adam::new(0.01).amsgrad(true)),
        }
    }

    fn slots(self) -> usize {
        match self {
            Config::Sgd => 0,
            Config::Momentum | Config::Nesterov | Config::SgdDecay => 1,
            Config::Adam | Config::AdamW => 2,
            Config::AmsGrad => 3,
        }
    }
}

/// Users of each node's outputs: node -> [(user, user's op)].
fn users(g: &Graph) -> HashMap<NodeId, Vec<NodeId>> {
    let mut map: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    for (id, node) in g.nodes() {
        for v in &node.inputs {
            map.entry(v.node).or_default().push(id);
        }
    }
    map
}

/// Checks the structure of a step updating variables of `shapes`; returns
/// what is wrong. Variables of at most one element update with scalar
/// reference ops (the fusion planner leaves one-element work unfused, as it
/// is cheaper interpreted than dispatched to a kernel).
fn check_one_region_per_variable(g: &Graph, shapes: &[Vec<usize>], slots: usize) -> Result<(), String> {
    let users = users(g);
    let fused: HashSet<usize> = (0..shapes.len()).filter(|&i| shapes[i].iter().product::<usize>() > 1).collect();
    let params: HashMap<NodeId, usize> = g
        .nodes()
        .filter_map(|(id, n)| match n.op {
            Op::Parameter { index } => Some((id, index)),
            _ => None,
        })
        .collect();
    let regions: Vec<NodeId> = g.nodes().filter(|(_, n)| matches!(n.op, Op::Fused { .. })).map(|(id, _)| id).collect();
    if regions.len() != fused.len() {
        return Err(format!("{} fused regions for {} variables of 2 or more elements", regions.len(), fused.len()));
    }
    let mut grads_seen = HashSet::new();
    let mut fed_by_regions = 0;
    for &r in &regions {
        let node = g.node(r);
        let grads: Vec<usize> = node.inputs.iter().filter_map(|v| params.get(&v.node).copied()).collect();
        if grads.len() != 1 || !fused.contains(&grads[0]) || !grads_seen.insert(grads[0]) {
            return Err(format!("region {r} reads gradients {grads:?}: not one of its own"));
        }
        let assigns = users.get(&r).map(Vec::as_slice).unwrap_or_default();
        if let Some(u) = assigns.iter().find(|&&u| !matches!(g.node(u).op, Op::AssignVariable { .. })) {
            return Err(format!("region {r}'s output goes to {} ({u}), not to an assignment", g.node(*u).op.name()));
        }
        // The region computes the new values themselves (`w - lr · u`), so
        // no assign_add/assign_sub runs a reference kernel afterwards.
        if let Some(u) =
            assigns.iter().find(|&&u| !matches!(g.node(u).op, Op::AssignVariable { kind: AssignKind::Assign, .. }))
        {
            return Err(format!("region {r} feeds {} ({u}), not a plain assignment", g.node(*u).op.name()));
        }
        if assigns.len() != 1 + slots {
            return Err(format!("region {r} feeds {} assignments, expected {}", assigns.len(), 1 + slots));
        }
        fed_by_regions += assigns.len();
    }
    // Every variable and slot is assigned once, and the step counter.
    let all_assigns = g.nodes().filter(|(_, n)| matches!(n.op, Op::AssignVariable { .. })).count();
    if all_assigns != shapes.len() * (1 + slots) + 1 {
        return Err(format!("{all_assigns} assignments ({fed_by_regions} from the update regions)"));
    }
    Ok(())
}

fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(prop::sample::select(vec![0usize, 1, 3, 5]), 0..=2)
}

fn values(vars: &[Variable]) -> Vec<Vec<f32>> {
    vars.iter().map(|v| v.value().to_vec::<f32>().unwrap()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn each_variable_updates_in_one_region(
        shapes in prop::collection::vec(shape_strategy(), 1..=3),
        config in prop::sample::select(CONFIGS.to_vec()),
        seed in 0u64..1000,
    ) {
        let make = || -> Vec<Variable> {
            shapes.iter().enumerate().map(|(i, s)| Variable::new(Tensor::randn(s, seed + i as u64))).collect()
        };
        let (traced_vars, eager_vars) = (make(), make());
        let (opt_t, opt_e) = (config.build(), config.build());
        let vs = traced_vars.clone();
        let step = function(move |grads: Vec<Tensor>| opt_t.apply_gradients(&grads, &vs));
        for k in 0..3u64 {
            let grads: Vec<Tensor> =
                shapes.iter().enumerate().map(|(i, s)| Tensor::randn(s, 100 * k + seed + i as u64)).collect();
            step.call(grads.clone()).unwrap();
            opt_e.apply_gradients(&grads, &eager_vars);
        }
        prop_assert_eq!(step.tracing_count(), 1);
        let cf = &step.concrete_functions()[0];
        let g = cf.optimized_graph();
        if let Err(why) = check_one_region_per_variable(g, &shapes, config.slots()) {
            return Err(TestCaseError::fail(format!("{config:?} on {shapes:?}: {why}\n{g}")));
        }
        let stats = cf.schedule_stats().expect("the JIT runs the step");
        let big = shapes.iter().filter(|s| s.iter().product::<usize>() > 1).count();
        prop_assert_eq!(stats.regions, big, "{}", stats);
        prop_assert_eq!(stats.gemms, 0);
        prop_assert_eq!(stats.writes, shapes.len() * (1 + config.slots()) + 1);
        // The compiled updates are the eager ones (f32; exact up to the
        // JIT's documented sqrt/div agreement).
        for (t, e) in values(&traced_vars).iter().zip(values(&eager_vars)) {
            for (a, b) in t.iter().zip(&e) {
                prop_assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{config:?}: {a} vs {b}");
            }
        }
    }
}
