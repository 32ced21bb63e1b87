//! Names for the dims the trace does not know, so a runtime sees a symbolic
//! input dim (`batch`) flow through to the outputs that have it.
//!
//! Each unknown input dim gets a name (`batch`, `dim_<axis>`, or the user's
//! through `Exporter::dim_param`); a forward walk of the export graph
//! carries the names through the ops whose shape rule says an output dim
//! *equals* an input dim (elementwise ops, broadcasting against 1,
//! reductions, matmul's outer dims, transposes, a reshape that keeps every
//! other dim, gathers, composite calls, loop-carried values the body keeps,
//! a name both branches of a `cond` give). An unknown output dim the walk
//! cannot tie to an input dim gets a fresh name of its own,
//! `<output>_dim<axis>`: ONNX treats two equal names as one size, so a name
//! is only ever shared where the sizes are equal for every input.

use std::collections::HashMap;

use tracejit_ir::{Graph, Op, TensorType, ValueId};
use tracejit_tensor::SliceSpec;

/// The symbolic name of each dim of a value (`None`: known, or unknown
/// with no name tied to an input).
type Syms = Vec<Option<String>>;

/// The names of the unknown dims of `g`'s outputs, given those of its
/// parameters (`params[i][axis]`, `None` where the dim is known).
pub(crate) fn output_dims(g: &Graph, params: &[Syms]) -> Vec<Syms> {
    let mut syms: HashMap<ValueId, Syms> = HashMap::new();
    for (i, &p) in g.params.iter().enumerate() {
        syms.insert(ValueId::new(p, 0), params.get(i).cloned().unwrap_or_default());
    }
    for (id, node) in g.nodes() {
        if matches!(node.op, Op::Parameter { .. }) {
            continue;
        }
        let ins: Vec<Syms> =
            node.inputs.iter().map(|v| syms.get(v).cloned().unwrap_or_else(|| unnamed(g.value_type(*v)))).collect();
        let in_types: Vec<&TensorType> = node.inputs.iter().map(|&v| g.value_type(v)).collect();
        let outs = node_dims(g, &node.op, &ins, &in_types, &node.outputs);
        for (i, (s, ty)) in outs.into_iter().zip(&node.outputs).enumerate() {
            // Only unknown dims carry a name; a known one never does.
            let s = s.into_iter().zip(&ty.dims).map(|(s, d)| if d.is_some() { None } else { s }).collect();
            syms.insert(ValueId::new(id, i as u32), s);
        }
    }
    g.outputs.iter().map(|v| syms.get(v).cloned().unwrap_or_else(|| unnamed(g.value_type(*v)))).collect()
}

fn unnamed(ty: &TensorType) -> Syms {
    vec![None; ty.rank()]
}

/// The dim names of each output of one node.
fn node_dims(g: &Graph, op: &Op, ins: &[Syms], in_types: &[&TensorType], outs: &[TensorType]) -> Vec<Syms> {
    let out_rank = |i: usize| outs.get(i).map_or(0, TensorType::rank);
    let x = ins.first().cloned().unwrap_or_default();
    let one = |s: Syms| vec![s];
    match op {
        Op::Unary(_) | Op::Cast { .. } | Op::Clamp { .. } => one(x),
        Op::Binary(_) | Op::Select => one(broadcast(ins, in_types, out_rank(0))),
        Op::Reduce { axes, keepdims, .. } => one(reduce(&x, axes, *keepdims)),
        Op::ArgReduce { axis, keepdims, .. } => one(reduce(&x, &[*axis], *keepdims)),
        Op::MatMul => {
            let (a, b) = (&ins[0], &ins[1]);
            let (ra, rb) = (a.len(), b.len());
            if ra < 2 || rb < 2 {
                return one(vec![None; out_rank(0)]);
            }
            let batch_types = [
                TensorType { dtype: in_types[0].dtype, dims: in_types[0].dims[..ra - 2].iter().copied().collect() },
                { TensorType { dtype: in_types[1].dtype, dims: in_types[1].dims[..rb - 2].iter().copied().collect() } },
            ];
            let batch_syms = [a[..ra - 2].to_vec(), b[..rb - 2].to_vec()];
            let mut s = broadcast(&batch_syms, &[&batch_types[0], &batch_types[1]], out_rank(0) - 2);
            s.push(a[ra - 2].clone());
            s.push(b[rb - 1].clone());
            one(s)
        }
        Op::Reshape { shape } => one(reshape(&x, in_types[0], shape, &outs[0])),
        Op::Transpose { perm } => one(perm.iter().map(|&p| x.get(p).cloned().flatten()).collect()),
        Op::BroadcastTo { .. } | Op::Constant { .. } | Op::ReadVariable { .. } | Op::Parameter { .. } => {
            one(vec![None; out_rank(0)])
        }
        Op::ExpandDims { axis } => {
            let mut s = x;
            s.insert((*axis).min(s.len()), None);
            one(s)
        }
        Op::Squeeze { axes } => {
            one(x.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, s)| s.clone()).collect())
        }
        Op::Concat { axis } => {
            let mut s = same_shape(ins, out_rank(0));
            if let Some(d) = s.get_mut(*axis) {
                *d = None;
            }
            one(s)
        }
        Op::Stack { axis } => {
            let mut s = same_shape(ins, out_rank(0).saturating_sub(1));
            s.insert((*axis).min(s.len()), None);
            one(s)
        }
        Op::Slice { specs } => one(x
            .iter()
            .enumerate()
            .map(|(i, s)| if specs.get(i) == Some(&SliceSpec::FULL) { s.clone() } else { None })
            .collect()),
        Op::Gather { axis } => {
            let idx = ins.get(1).cloned().unwrap_or_default();
            let mut s: Syms = x[..(*axis).min(x.len())].to_vec();
            s.extend(idx);
            s.extend(x.iter().skip(axis + 1).cloned());
            one(s)
        }
        Op::OneHot { .. } => {
            let mut s = x;
            s.push(None);
            one(s)
        }
        // The input's dims where the op keeps them.
        Op::ScatterAdd { .. } | Op::DynamicUpdateSlice | Op::Cumsum { .. } => one(x),
        Op::GatherElements { .. } => one(ins.get(1).cloned().unwrap_or_default()),
        Op::Pad { pads, .. } => {
            one(x.iter().zip(pads).map(|(s, p)| if *p == (0, 0) { s.clone() } else { None }).collect())
        }
        Op::TopK { .. } => {
            let mut s = x;
            if let Some(last) = s.last_mut() {
                *last = None;
            }
            vec![s.clone(), s]
        }
        // Convolutions and pools keep the batch; their other dims change.
        Op::Spatial(sp) => {
            let mut s = vec![None; out_rank(0)];
            if !matches!(sp, tracejit_ir::tensor::SpatialOp::Conv2dBackwardFilter { .. }) && !s.is_empty() {
                s[0] = x.first().cloned().flatten();
            }
            let mut all = vec![s];
            all.extend((1..outs.len()).map(|i| vec![None; out_rank(i)]));
            all
        }
        Op::Random { shape: None, .. } => one(ins.get(1).cloned().unwrap_or_default()),
        Op::DynamicSlice { .. } | Op::Random { .. } => one(vec![None; out_rank(0)]),
        // A composite's body (as traced, its fused regions not yet
        // dissolved) takes the call's inputs as its parameters, as does a
        // fused region's.
        Op::Call { func } => output_dims(&g.library.get(*func).graph, ins),
        Op::Fused { body } => output_dims(body, ins),
        // A carried value keeps an input dim's name where the body returns
        // that same dim (the loop never changes it).
        Op::While { parts, .. } => {
            let body = output_dims(&parts[1], ins);
            (0..outs.len())
                .map(|i| {
                    let carried = ins.get(i).cloned().unwrap_or_else(|| vec![None; out_rank(i)]);
                    let kept = body.get(i);
                    (0..out_rank(i))
                        .map(|a| {
                            carried
                                .get(a)
                                .cloned()
                                .flatten()
                                .filter(|s| kept.and_then(|k| k.get(a)) == Some(&Some(s.clone())))
                        })
                        .collect()
                })
                .collect()
        }
        // A name both branches give an output.
        Op::Cond { branches } => {
            let [then, other] = [0, 1].map(|b| output_dims(&branches[b], &ins[1..]));
            (0..outs.len())
                .map(|i| {
                    (0..out_rank(i))
                        .map(|a| {
                            let t = then.get(i).and_then(|s| s.get(a)).cloned().flatten();
                            t.filter(|t| other.get(i).and_then(|s| s.get(a)) == Some(&Some(t.clone())))
                        })
                        .collect()
                })
                .collect()
        }
        Op::Kernel { .. } | Op::AssignVariable { .. } => (0..outs.len()).map(|i| vec![None; out_rank(i)]).collect(),
    }
}

/// Broadcasting, aligned on the right: an output dim is named `s` when
/// some operand's dim is `s` and every other operand's is `s`, a known 1,
/// or absent (a shorter rank).
fn broadcast(ins: &[Syms], in_types: &[&TensorType], rank: usize) -> Syms {
    (0..rank)
        .map(|i| {
            let mut name: Option<&String> = None;
            for (s, ty) in ins.iter().zip(in_types) {
                let Some(axis) = (i + s.len()).checked_sub(rank) else { continue };
                match (&s[axis], ty.dims[axis]) {
                    (_, Some(1)) => {}
                    (Some(n), None) if name.is_none_or(|m| m == n) => name = Some(n),
                    _ => return None,
                }
            }
            name.cloned()
        })
        .collect()
}

/// Operands of one shape (concat's other axes, stack): the first name any
/// of them has.
fn same_shape(ins: &[Syms], rank: usize) -> Syms {
    (0..rank).map(|i| ins.iter().find_map(|s| s.get(i).cloned().flatten())).collect()
}

fn reduce(x: &Syms, axes: &[usize], keepdims: bool) -> Syms {
    x.iter()
        .enumerate()
        .filter_map(|(i, s)| match (axes.contains(&i), keepdims) {
            (false, _) => Some(s.clone()),
            (true, true) => Some(None),
            (true, false) => None,
        })
        .collect()
}

/// A reshape whose single unknown output dim sits where the input's single
/// unknown dim sits, with the known dims before and after it multiplying
/// to the same sizes, keeps that dim (`[batch, 28, 28] -> [batch, 784]`).
fn reshape(x: &Syms, from: &TensorType, shape: &[i64], to: &TensorType) -> Syms {
    let mut out = vec![None; to.rank()];
    let unknown = |t: &TensorType| {
        let u: Vec<usize> = (0..t.rank()).filter(|&i| t.dims[i].is_none()).collect();
        (u.len() == 1).then(|| u[0])
    };
    let (Some(i), Some(j)) = (unknown(from), unknown(to)) else { return out };
    let product =
        |t: &TensorType, r: std::ops::Range<usize>| -> usize { t.dims[r].iter().map(|d| d.unwrap_or(1)).product() };
    let same_before = product(from, 0..i) == product(to, 0..j);
    let same_after = product(from, i + 1..from.rank()) == product(to, j + 1..to.rank());
    if same_before && same_after && shape.len() == to.rank() {
        out[j] = x.get(i).cloned().flatten();
    }
    out
}
