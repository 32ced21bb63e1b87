//! `hoist`: moves a loop's input projection out of the loop. In a counted
//! loop (`fori_loop`: a `while` with a static trip count whose counter
//! goes up by one per trip), a body product `gather(xs, i) @ w` of a
//! captured sequence `xs` and a captured matrix `w`, indexed by the counter
//! along a batch axis, becomes `gather(xs @ w, i)` with `xs @ w` computed
//! once before the loop: one large GEMM instead of one small GEMM per trip
//! (what cuDNN and PyTorch do for an RNN's input weights).
//!
//! Why it is safe and never more work:
//! - Rows of a matrix product are independent, so slice `i` of `xs @ w` is
//!   `xs[i] @ w`: the same products and sums (a GEMM may order a row's sum
//!   differently for another shape, within the usual `k·ε·Σ|aᵢbᵢ|` bound).
//!   A NaN or infinity in another slice stays in that slice.
//! - The gathered axis is no longer than the trip count, so the hoisted
//!   product computes at most the rows the loop would have computed.
//! - An out-of-range index fails the same way: the hoisted gather reads an
//!   axis of the same length.
//! - Only pure nodes move; the loop runs at least once (the trip count is
//!   at least one), so no work is done that the loop would have skipped.

use smallvec::SmallVec;
use tracejit_tensor::{BinaryOp, DType, Storage};

use crate::passes::{run_in_subgraphs, Pass, PassContext, PassResult, Rewriter};
use crate::{Graph, NodeId, Op, ValueId};

/// The loop input projection hoisting pass (`hoist`).
#[derive(Clone, Copy, Debug, Default)]
pub struct HoistLoopProducts;

/// One body product to hoist.
struct Candidate {
    /// The body's `matmul` node.
    matmul: NodeId,
    /// The gathered axis of `xs`.
    axis: usize,
    /// The body parameters holding `xs` and `w` (captures).
    xs: usize,
    w: usize,
    /// The counter (a body value).
    index: ValueId,
}

impl Pass for HoistLoopProducts {
    fn name(&self) -> &'static str {
        "hoist"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        // Inner loops first: a hoisted product may be hoisted again.
        let nested = run_in_subgraphs(self, g, cx);
        nested.and(self.run_here(g))
    }
}

/// The body parameter index `v` is, if it is a parameter.
fn param_index(g: &Graph, v: ValueId) -> Option<usize> {
    match g.node(v.node).op {
        Op::Parameter { index } => Some(index),
        _ => None,
    }
}

/// True when `v` is a one-element integer constant equal to 1.
fn is_int_one(g: &Graph, v: ValueId) -> bool {
    match &g.node(v.node).op {
        Op::Constant { value } if value.len() == 1 => match value {
            Storage::I32(a) => a.iter().all(|&x| x == 1),
            Storage::I64(a) => a.iter().all(|&x| x == 1),
            Storage::I8(a) => a.iter().all(|&x| x == 1),
            Storage::U8(a) => a.iter().all(|&x| x == 1),
            Storage::I16(a) => a.iter().all(|&x| x == 1),
            Storage::U16(a) => a.iter().all(|&x| x == 1),
            Storage::U32(a) => a.iter().all(|&x| x == 1),
            Storage::U64(a) => a.iter().all(|&x| x == 1),
            Storage::F32(_) | Storage::F64(_) | Storage::Bool(_) | Storage::BF16(_) | Storage::F16(_) => false,
        },
        _ => false,
    }
}

/// True when carried value `k` of `body` is a scalar integer counter that
/// the body increments by exactly one.
fn is_counter(body: &Graph, k: usize) -> bool {
    let ty = body.value_type(ValueId::new(body.params[k], 0));
    if ty.rank() != 0 || !matches!(ty.dtype, DType::I32 | DType::I64) {
        return false;
    }
    let Some(&next) = body.outputs.get(k) else { return false };
    let node = body.node(next.node);
    if !matches!(node.op, Op::Binary(BinaryOp::Add)) || !node.control_inputs.is_empty() {
        return false;
    }
    let (a, b) = (node.inputs[0], node.inputs[1]);
    (param_index(body, a) == Some(k) && is_int_one(body, b)) || (param_index(body, b) == Some(k) && is_int_one(body, a))
}

/// The products of `body` that can move out of a loop of `trips` trips.
fn candidates(body: &Graph, trips: usize) -> Vec<Candidate> {
    let carried = body.outputs.len();
    let mut found = Vec::new();
    for (id, node) in body.nodes() {
        if !matches!(node.op, Op::MatMul) || !node.control_inputs.is_empty() {
            continue;
        }
        let (lhs, w) = (node.inputs[0], node.inputs[1]);
        let gather = body.node(lhs.node);
        let Op::Gather { axis } = gather.op else { continue };
        if !gather.control_inputs.is_empty() {
            continue;
        }
        let (xs, index) = (gather.inputs[0], gather.inputs[1]);
        let (Some(xs_param), Some(w_param), Some(counter)) =
            (param_index(body, xs), param_index(body, w), param_index(body, index))
        else {
            continue;
        };
        let (xs_ty, w_ty) = (body.value_type(xs), body.value_type(w));
        let Some(xs_shape) = xs_ty.shape() else { continue };
        // A batch axis of the product (not one of the matrix axes), no
        // longer than the trip count; `w` a plain matrix.
        let fits = xs_shape.len() >= 3 && axis < xs_shape.len() - 2 && xs_shape[axis] <= trips && w_ty.rank() == 2;
        if fits && xs_param >= carried && w_param >= carried && counter < carried && is_counter(body, counter) {
            found.push(Candidate { matmul: id, axis, xs: xs_param, w: w_param, index });
        }
    }
    found
}

/// `g` rebuilt with one more parameter per type in `extra`, and each listed
/// matmul node replaced by a gather of its new parameter (`None` if a
/// replacement would change a type).
fn with_extra_params(g: &Graph, extra: &[crate::TensorType], replace: &[Candidate]) -> Option<Graph> {
    let mut rw = Rewriter::new(g);
    let new_params: Vec<ValueId> = extra.iter().map(|t| rw.add_param(t.clone())).collect();
    for (id, node) in g.nodes() {
        if rw.is_mapped(id) {
            continue;
        }
        match replace.iter().position(|c| c.matmul == id) {
            Some(k) => {
                let index = rw.value(replace[k].index);
                let op = Op::Gather { axis: replace[k].axis };
                if !rw.replace_if_types(id, op, &[new_params[k], index], &node.outputs) {
                    return None;
                }
            }
            None => {
                rw.copy(id);
            }
        }
    }
    Some(rw.finish())
}

impl HoistLoopProducts {
    /// The rewrite of `g` itself (its subgraphs are done by `run`).
    fn run_here(&self, g: &mut Graph) -> PassResult {
        let loops: Vec<(NodeId, Vec<Candidate>)> = g
            .nodes()
            .filter_map(|(id, node)| match &node.op {
                Op::While { parts, trip_count: Some(trips), .. } if *trips >= 1 => {
                    let c = candidates(&parts[1], *trips);
                    (!c.is_empty()).then_some((id, c))
                }
                _ => None,
            })
            .collect();
        if loops.is_empty() {
            return PassResult::unchanged();
        }
        let mut rw = Rewriter::new(g);
        let mut hoisted = 0usize;
        for (id, node) in g.nodes() {
            if rw.is_mapped(id) {
                continue;
            }
            let (Some((_, cands)), Op::While { parts, trip_count, cancel }) =
                (loops.iter().find(|(l, _)| *l == id), &node.op)
            else {
                rw.copy(id);
                continue;
            };
            let inputs = rw.inputs(id);
            // The products, before the loop.
            let mut products: SmallVec<[ValueId; 2]> = SmallVec::new();
            for c in cands {
                let location = parts[1].node(c.matmul).location;
                match rw.emit(Op::MatMul, &[inputs[c.xs], inputs[c.w]], &[], location) {
                    Ok(p) => products.push(ValueId::new(p, 0)),
                    Err(_) => break,
                }
            }
            let types: Vec<crate::TensorType> = products.iter().map(|p| rw.value_type(*p).clone()).collect();
            let rebuilt = (products.len() == cands.len())
                .then(|| {
                    let cond = with_extra_params(&parts[0], &types, &[])?;
                    let body = with_extra_params(&parts[1], &types, cands)?;
                    Some((cond, body))
                })
                .flatten();
            let Some((cond, body)) = rebuilt else {
                // A product that does not type-check is left in the loop
                // (the emitted products are dead, and `dce` drops them).
                rw.copy(id);
                continue;
            };
            let op = Op::While { parts: [cond.into(), body.into()], trip_count: *trip_count, cancel: cancel.clone() };
            let all: SmallVec<[ValueId; 4]> = inputs.iter().copied().chain(products.iter().copied()).collect();
            let control = rw.control(id);
            match rw.emit(op, &all, &control, node.location) {
                Ok(new_id) => {
                    let outs: Vec<ValueId> = (0..node.outputs.len()).map(|k| ValueId::new(new_id, k as u32)).collect();
                    rw.map(id, &outs, &[new_id]);
                    hoisted += cands.len();
                }
                Err(_) => {
                    rw.copy(id);
                }
            }
        }
        if hoisted == 0 {
            return PassResult::unchanged();
        }
        *g = rw.finish();
        PassResult::count(hoisted, if hoisted == 1 { "product hoisted" } else { "products hoisted" })
    }
}
