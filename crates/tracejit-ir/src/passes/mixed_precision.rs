//! `auto_mixed_precision`: the precision pass. It picks each product's
//! precision — f32, bf16 (or f16) operands with f32 accumulation, or int8
//! with scales — in one place, before fusion, where it is dumped and
//! verified like every other pass; the JIT lowers what it chose (a product
//! of rounded operands onto its bf16 GEMM, the int8 kernel as a kernel
//! step).
//!
//! Int8 ([`PassContext::int8_products`], what `tracejit::quantize::dynamic`
//! asks for): every f32 product against a weight becomes the dynamic int8
//! kernel (see `int8_products.rs`); it takes precedence over bf16 for
//! those products.
//!
//! Bf16: Grappler's pass of the same name, for bf16 (or f16) on CPU. Each
//! f32 product and convolution reads its operands rounded
//! to the low dtype, `cast(cast(x, bf16), f32)`, and keeps its f32 result:
//! the products of 8-bit-significand values are exact in f32, so this is a
//! bf16 product accumulated in f32, which the JIT runs on its bf16 GEMM
//! (`vdpbf16ps`) without materializing the rounded copies.
//!
//! Which ops change is a list, as in Grappler and PyTorch's autocast:
//!
//! | list | ops | dtype |
//! |---|---|---|
//! | allow | `matmul`, `conv2d`, `conv2d_backward_data`, `conv2d_backward_filter` | operands rounded to the low dtype, f32 accumulation and result |
//! | deny | every other op: `exp`, `log`, softmax, reductions, normalizations, losses, elementwise arithmetic, optimizer updates | f32, unchanged |
//!
//! There is no "infer" list: the allowed ops' results stay f32, so nothing
//! downstream sees a low dtype. Variables stay f32 and their gradients are
//! f32 (the backward's products are products too, so they are rounded
//! likewise, as autocast does). A value read by several products is
//! rounded once. The pass runs inside loop bodies and branches.
//!
//! A composite's kernel that has a mixed-precision form
//! ([`crate::ExternalKernel::mixed_precision`]) is swapped for it:
//! attention's forward then runs its two products on bf16 operands with
//! f32 accumulation (its softmax stays f32), as autocast runs SDPA in
//! bf16; its backward and the other kernels (LSTM, layer norm) keep
//! their own f32 arithmetic.

use std::collections::HashMap;

use tracejit_tensor::{DType, SpatialOp};

use crate::passes::{run_in_subgraphs, Pass, PassContext, PassResult, Rewriter};
use crate::{Graph, NodeId, Op, ValueId};

/// The precision pass (`auto_mixed_precision`); a no-op unless
/// [`PassContext::mixed_precision`] names a low dtype or
/// [`PassContext::int8_products`] is set.
#[derive(Clone, Copy, Debug, Default)]
pub struct AutoMixedPrecision;

impl Pass for AutoMixedPrecision {
    fn name(&self) -> &'static str {
        "auto_mixed_precision"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> PassResult {
        let low = cx.mixed_precision.filter(|d| d.is_low_precision());
        if low.is_none() && !cx.int8_products {
            return PassResult::unchanged();
        }
        let nested = run_in_subgraphs(self, g, cx);
        let int8 = if cx.int8_products {
            let n = super::int8_products::quantize_products(g);
            PassResult::count(n, if n == 1 { "product in int8" } else { "products in int8" })
        } else {
            PassResult::unchanged()
        };
        let nested = nested.and(int8);
        let Some(low) = low else { return nested };
        let kernels = swap_kernels(g, low);
        let operands: Vec<(NodeId, Vec<usize>)> =
            g.nodes().filter_map(|(id, _)| Some((id, rounded_operands(g, id, low)?))).collect();
        if operands.is_empty() {
            return nested.and(kernels);
        }
        let mut rw = Rewriter::new(g);
        // The rounded f32 copy of each old value, made once.
        let mut rounded: HashMap<ValueId, ValueId> = HashMap::new();
        let mut changed = 0;
        for (id, node) in g.nodes() {
            if rw.is_mapped(id) {
                continue;
            }
            let Some((_, which)) = operands.iter().find(|(n, _)| *n == id) else {
                rw.copy(id);
                continue;
            };
            let mut inputs = rw.inputs(id);
            for &i in which {
                let old = node.inputs[i];
                let v = match rounded.get(&old) {
                    Some(&v) => v,
                    None => {
                        let v = round_through(&mut rw, inputs[i], low, node.location);
                        rounded.insert(old, v);
                        v
                    }
                };
                inputs[i] = v;
            }
            if rw.replace_if_types(id, node.op.clone(), &inputs, &node.outputs) {
                changed += 1;
            } else {
                rw.copy(id);
            }
        }
        *g = rw.finish();
        let what = if changed == 1 { "product" } else { "products" };
        nested.and(kernels).and(PassResult::count(changed, &format!("{what} in {low} with f32 accumulation")))
    }
}

/// Swaps each kernel node that has a mixed-precision form for `low` for
/// that form, in place (same inputs, outputs and name).
fn swap_kernels(g: &mut Graph, low: DType) -> PassResult {
    let swaps: Vec<(NodeId, Op)> = g
        .nodes()
        .filter_map(|(id, node)| {
            let Op::Kernel { name, kernel, inputs, outputs } = &node.op else { return None };
            let kernel = kernel.mixed_precision(low)?;
            Some((id, Op::Kernel { name: name.clone(), kernel, inputs: inputs.clone(), outputs: outputs.clone() }))
        })
        .collect();
    let n = swaps.len();
    for (id, op) in swaps {
        g.node_mut(id).op = op;
    }
    let what = if n == 1 { "kernel" } else { "kernels" };
    PassResult::count(n, &format!("{what} with {low} products"))
}

/// `cast(cast(v, low), f32)` in the new graph.
fn round_through(
    rw: &mut Rewriter<'_>,
    v: ValueId,
    low: DType,
    location: Option<&'static std::panic::Location<'static>>,
) -> ValueId {
    let down = rw.emit(Op::Cast { to: low }, &[v], &[], location).expect("a cast of an f32 value types");
    let up =
        rw.emit(Op::Cast { to: DType::F32 }, &[ValueId::new(down, 0)], &[], location).expect("a cast of a value types");
    ValueId::new(up, 0)
}

/// The operands of node `id` to round: those of an allow-listed op whose
/// operands and result are f32 (a product's two, a convolution's input and
/// filter, never its bias). `None` for every other node.
fn rounded_operands(g: &Graph, id: NodeId, low: DType) -> Option<Vec<usize>> {
    let node = g.node(id);
    let which: &[usize] = match &node.op {
        Op::MatMul => &[0, 1],
        Op::Spatial(SpatialOp::Conv2d { .. }) | Op::Spatial(SpatialOp::Conv2dBackwardData { .. }) => &[0, 1],
        Op::Spatial(SpatialOp::Conv2dBackwardFilter { .. }) => &[0, 1],
        Op::Spatial(
            SpatialOp::MaxPool2d { .. }
            | SpatialOp::MaxPool2dBackward { .. }
            | SpatialOp::AvgPool2d { .. }
            | SpatialOp::AvgPool2dBackward { .. },
        ) => return None,
        // The deny list: every other op keeps f32.
        _ => return None,
    };
    let f32s = which.iter().all(|&i| g.value_type(node.inputs[i]).dtype == DType::F32)
        && node.outputs.iter().all(|t| t.dtype == DType::F32);
    // An operand that is already `cast(cast(x, low), f32)` is rounded: a
    // second run of the pass changes nothing.
    let todo: Vec<usize> = which.iter().copied().filter(|&i| !is_rounded(g, node.inputs[i], low)).collect();
    (f32s && !todo.is_empty()).then_some(todo)
}

/// True when `v` is `cast(cast(x, low), f32)`.
fn is_rounded(g: &Graph, v: ValueId, low: DType) -> bool {
    let outer = g.node(v.node);
    let Op::Cast { to: DType::F32 } = outer.op else { return false };
    matches!(g.node(outer.inputs[0].node).op, Op::Cast { to } if to == low)
}
