//! `simplify`'s data-movement rules, by property tests against the
//! interpreter: a reshape that splits a sliced last axis moves before the
//! slice, and zero-padded pieces summed back into one tensor join into a
//! padded concat — bit for bit (signed zeros, NaN and infinities
//! included), and only where the rule's conditions hold.

use tracejit_ir::passes::{PassContext, Simplify};
use tracejit_ir::tensor::{BinaryOp, SliceSpec, Storage};
use tracejit_ir::{interpret, Graph, Op};

use crate::common::{f32s, f32t, node};
use crate::passes::{bin, count_ops, f32c, run_checked, same_results};

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]

    /// `reshape(slice(x, last axis), [.., h, d])` becomes a slice of a
    /// reshape of `x` exactly when `d` divides the start and the axis,
    /// with the same results; otherwise the graph is unchanged.
    #[test]
    fn simplify_moves_a_reshape_before_a_last_axis_slice(
        lead in proptest::collection::vec(0usize..4, 0..3),
        (n, start, h, d) in (0usize..13, 0usize..13, 0usize..5, 1usize..5),
        first_axis_sliced in proptest::bool::ANY,
        seed in proptest::prelude::any::<u64>(),
    ) {
        proptest::prop_assume!(start + h * d <= n);
        let dims: Vec<usize> = lead.iter().copied().chain([n]).collect();
        let mut g = Graph::new("split");
        let x = g.add_param(f32t(&dims.iter().map(|&v| v as i64).collect::<Vec<_>>()));
        let r = dims.len();
        let mut specs = vec![SliceSpec::FULL; r];
        specs[r - 1] = SliceSpec::range(start as i64, (start + h * d) as i64);
        let cut_first = first_axis_sliced && r > 1 && dims[0] > 0;
        if cut_first {
            specs[0] = SliceSpec::range(0, dims[0] as i64 - 1);
        }
        let sliced = node(&mut g, Op::Slice { specs }, &[x]);
        let mut shape: Vec<i64> = g.value_type(sliced).shape().unwrap()[..r - 1].iter().map(|&v| v as i64).collect();
        shape.extend([h as i64, d as i64]);
        g.outputs = vec![node(&mut g, Op::Reshape { shape }, &[sliced])];
        let (after, result) = run_checked(&Simplify, &g, &PassContext::new("split"));
        let moves = !cut_first && start % d == 0 && n % d == 0;
        proptest::prop_assert_eq!(result.changed, moves, "{}", after);
        if moves {
            let out = after.node(after.outputs[0].node);
            proptest::prop_assert!(matches!(out.op, Op::Slice { .. }), "{}", after);
            let inner = after.node(out.inputs[0].node);
            proptest::prop_assert!(matches!(inner.op, Op::Reshape { .. }) && inner.inputs[0] == x, "{}", after);
        }
        let args = [f32s(&dims, seed)];
        proptest::prop_assert!(same_results(&interpret(&g, &args).unwrap(), &interpret(&after, &args).unwrap()));
    }
}

/// An f32 tensor of `shape` with -0.0, +0.0, NaN and infinities among
/// ordinary values.
fn signed_zeros(shape: &[usize], seed: u64) -> Storage {
    let specials = [-0.0f32, 0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
    let v: Vec<f32> = f32s(shape, seed)
        .to_vec::<f32>()
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(i, x)| {
            if (i as u64).wrapping_add(seed).is_multiple_of(3) {
                specials[(i as u64).wrapping_add(seed) as usize % specials.len()]
            } else {
                x
            }
        })
        .collect();
    Storage::from_vec(v, shape).unwrap()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    /// Sums of zero-padded pieces that tile ranges of one axis become one
    /// padded concat plus +0.0, bit for bit (signed zeros, NaN and
    /// infinities included); gapped pieces or another pad value (-0.0, 1.0)
    /// stay as they are.
    #[test]
    fn simplify_joins_padded_pieces_into_a_concat(
        rank in 1usize..4,
        axis_pick in 0usize..3,
        pieces in proptest::collection::vec(0usize..4, 2..4),
        lead in 0usize..3,
        order in proptest::collection::vec(0usize..3, 3),
        gap in 0usize..2,
        value in proptest::sample::select(vec![0.0f64, -0.0, 1.0]),
        wrap in proptest::bool::ANY,
        seed in proptest::prelude::any::<u64>(),
    ) {
        let axis = axis_pick % rank;
        let total: usize = lead + pieces.iter().sum::<usize>() + gap * (pieces.len() - 1) + 1;
        let dims = |len: usize| -> Vec<usize> { (0..rank).map(|i| if i == axis { len } else { 2 }).collect() };
        let mut g = Graph::new("pads");
        let mut args = Vec::new();
        let mut summands = Vec::new();
        let mut at = lead;
        for (i, &len) in pieces.iter().enumerate() {
            let d = dims(len);
            let x = g.add_param(f32t(&d.iter().map(|&v| v as i64).collect::<Vec<_>>()));
            args.push(signed_zeros(&d, seed.wrapping_add(i as u64)));
            let mut pads = vec![(0usize, 0usize); rank];
            pads[axis] = (at, total - at - len);
            let mut p = node(&mut g, Op::Pad { pads, value }, &[x]);
            if wrap && i == 1 {
                let z = f32c(&mut g, 0.0);
                p = bin(&mut g, BinaryOp::Add, p, z);
            }
            summands.push(p);
            at += len + gap;
        }
        // Add in a random order (left to right over a permutation).
        let mut idx: Vec<usize> = (0..summands.len()).collect();
        for (i, &o) in order.iter().enumerate().take(idx.len()) {
            idx.swap(i, o % summands.len());
        }
        let mut acc = summands[idx[0]];
        for &i in &idx[1..] {
            acc = bin(&mut g, BinaryOp::Add, acc, summands[i]);
        }
        g.outputs = vec![acc];
        let (after, _) = run_checked(&Simplify, &g, &PassContext::new("pads"));
        let joins = value.to_bits() == 0 && gap == 0;
        let concats = count_ops(&after, "concat");
        // Non-empty pieces added each next to the ones before join.
        if joins && pieces.iter().all(|&n| n > 0) && idx.windows(2).all(|w| w[0].abs_diff(w[1]) == 1) {
            proptest::prop_assert!(concats >= 1, "{}", after);
        }
        if !joins {
            proptest::prop_assert_eq!(concats, 0, "{}", after);
        }
        proptest::prop_assert!(same_results(&interpret(&g, &args).unwrap(), &interpret(&after, &args).unwrap()), "{}\n{}", g, after);
    }
}
