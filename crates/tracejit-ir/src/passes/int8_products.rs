//! The int8 half of the precision pass ([`super::AutoMixedPrecision`]
//! with [`PassContext::int8_products`](super::PassContext::int8_products)):
//! dynamic int8 quantization for inference (PyTorch's `quantize_dynamic`,
//! ONNX Runtime's dynamic quantization). Every f32 product whose right
//! operand is a variable's value or a constant (or its transpose) becomes
//! the kernel [`INT8_KERNEL_NAME`], which runs it on `vpdpbusd` where the
//! CPU has AVX-512 VNNI (AMX tiles where granted; a portable path
//! otherwise).
//!
//! - Weights: symmetric int8 with one scale per output column, quantized
//!   once per weight version (the packed form is kept while the variable's
//!   buffer is the same, so an assignment re-quantizes on the next call).
//! - Activations: int8 with one scale per row, computed at run time.
//! - Everything else stays f32, and the result is f32. That includes a
//!   product with the weight on the left (`w @ x`) and a batched weight
//!   (rank above 2): neither has per-output-column scales of one matrix.
//!
//! The error of each output is at most about `2⁻⁷` of the row's largest
//! |activation| times the column's largest |weight| per term (the two
//! roundings), so results agree with f32 to about 1e-2 of the output's
//! magnitude (see `tracejit_kernels::int8`).

use std::sync::{Arc, Mutex};

use tracejit_kernels::int8::{gemm_dynamic_i8, PackedI8, MAX_K};
use tracejit_kernels::Isa;
use tracejit_tensor::{DType, Storage};

use crate::{ExternalKernel, Graph, NodeId, Op, TensorType, ValueId};

/// The name of the int8 product's kernel in graph listings (and what
/// [`int8_kernel`] registers under, so a quantized graph's text parses).
pub const INT8_KERNEL_NAME: &str = "tracejit.quantize.matmul_dynamic_i8";

/// What [`int8_census`] found in a graph (loop bodies and branches
/// included): its products, and how many of them the precision pass puts
/// in int8.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Int8Census {
    /// Matrix products (`matmul` nodes).
    pub products: usize,
    /// Those the pass rewrites: f32, against a `[k, n]` weight, `k` within
    /// the kernel's range.
    pub eligible: usize,
}

/// Counts `g`'s products and those the precision pass would put in int8,
/// without changing anything: for the caller's error when there are none.
pub fn int8_census(g: &Graph) -> Int8Census {
    let mut c = Int8Census::default();
    census(g, &mut c);
    c
}

fn census(g: &Graph, c: &mut Int8Census) {
    for (id, node) in g.nodes() {
        if matches!(node.op, Op::MatMul) {
            c.products += 1;
            c.eligible += usize::from(eligible(g, id));
        }
        for sub in node.op.subgraphs() {
            census(sub, c);
        }
    }
}

/// A fresh int8 product kernel: `x [.., k] · w [k, n]` in f32 out.
pub fn int8_kernel() -> Arc<dyn ExternalKernel> {
    Arc::new(DynamicI8::default())
}

/// Rewrites `g`'s eligible products (not those of its subgraphs, which
/// the pass visits itself) to the int8 kernel, reading the f32 values a
/// mixed-precision rounding had put on their operands. Returns how many.
pub(crate) fn quantize_products(g: &mut Graph) -> usize {
    let ids: Vec<NodeId> =
        g.nodes().filter(|(id, n)| matches!(n.op, Op::MatMul) && eligible(g, *id)).map(|(id, _)| id).collect();
    for &id in &ids {
        let node = g.node(id);
        let operands: Vec<ValueId> = node.inputs.iter().map(|&v| unrounded(g, v)).collect();
        let inputs: Vec<TensorType> = operands.iter().map(|v| g.value_type(*v).clone()).collect();
        let op = Op::Kernel {
            name: INT8_KERNEL_NAME.to_string(),
            kernel: int8_kernel(),
            inputs,
            outputs: node.outputs.to_vec(),
        };
        let node = g.node_mut(id);
        node.inputs = operands.into_iter().collect();
        node.op = op;
    }
    ids.len()
}

/// True for an f32 product `x · w` with `w` a `[k, n]` variable value or
/// constant (or a transpose of one) and `k` within the int8 kernel's range.
fn eligible(g: &Graph, id: NodeId) -> bool {
    let node = g.node(id);
    let (x, w) = (g.value_type(node.inputs[0]), g.value_type(node.inputs[1]));
    let shapes = w.rank() == 2 && x.rank() >= 2 && w.dims[0].is_some_and(|k| k <= MAX_K);
    let f32s = x.dtype == DType::F32 && w.dtype == DType::F32 && node.outputs[0].dtype == DType::F32;
    shapes && f32s && is_weight(g, unrounded(g, node.inputs[1]).node)
}

/// The f32 value `v` is a rounding of (`cast(cast(x, bf16 or f16), f32)`,
/// what mixed precision puts on a product's operands), else `v`.
fn unrounded(g: &Graph, v: ValueId) -> ValueId {
    let up = g.node(v.node);
    if !matches!(up.op, Op::Cast { to: DType::F32 }) {
        return v;
    }
    let down = g.node(up.inputs[0].node);
    let rounds = matches!(down.op, Op::Cast { to: DType::BF16 | DType::F16 });
    if rounds && g.value_type(down.inputs[0]).dtype == DType::F32 {
        down.inputs[0]
    } else {
        v
    }
}

/// True when node `id` reads a variable, is a constant, or transposes one.
fn is_weight(g: &Graph, id: NodeId) -> bool {
    let node = g.node(id);
    matches!(node.op, Op::ReadVariable { .. } | Op::Constant { .. })
        || (matches!(node.op, Op::Transpose { .. }) && is_weight(g, node.inputs[0].node))
}

/// A quantized weight with the value it was quantized from (held, so its
/// buffer cannot be reused for another value while the quantized form may
/// be found by it).
struct Quantized {
    from: Storage,
    packed: PackedI8,
}

/// The quantized weights any kernel holds, found by their buffer: every
/// product multiplying by one weight shares its quantized form (W15's six
/// length buckets each quantized all-MiniLM-L6-v2's weights for
/// themselves, 40 MB held where 6.6 suffice). Entries die with the last
/// kernel holding them.
static SHARED: Mutex<Vec<std::sync::Weak<Quantized>>> = Mutex::new(Vec::new());

/// `w` quantized, from [`SHARED`] or now (and shared).
fn shared_quantized(w: &Storage) -> Arc<Quantized> {
    let found = {
        let shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        shared.iter().filter_map(std::sync::Weak::upgrade).find(|q| q.from.same_elements(w))
    };
    if let Some(q) = found {
        return q;
    }
    let a = w.array::<f32>().expect("an f32 weight (checked when quantized)");
    let packed = PackedI8::quantize(a.view().into_dimensionality().expect("a [k, n] weight"));
    let q = Arc::new(Quantized { from: w.clone(), packed });
    let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    shared.retain(|e| e.strong_count() > 0);
    shared.push(Arc::downgrade(&q));
    q
}

/// The int8 product kernel: `x [.., k] · w [k, n]`, the weight quantized
/// once per buffer, the activations per row on each call.
#[derive(Default)]
struct DynamicI8 {
    /// The last weight's quantized form.
    packed: Mutex<Option<Arc<Quantized>>>,
}

impl std::fmt::Debug for DynamicI8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DynamicI8")
    }
}

impl DynamicI8 {
    fn weight(&self, w: &Storage) -> Arc<Quantized> {
        let mut cached = self.packed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(q) = cached.as_ref().filter(|q| q.from.same_elements(w)) {
            return q.clone();
        }
        let q = shared_quantized(w);
        *cached = Some(q.clone());
        q
    }
}

impl ExternalKernel for DynamicI8 {
    fn run(&self, inputs: &[Storage], isa: Isa) -> Vec<Storage> {
        let (x, w) = (&inputs[0], &inputs[1]);
        let quantized = self.weight(w);
        let packed = &quantized.packed;
        let (k, n) = (packed.k(), packed.n());
        let mut shape = x.shape().to_vec();
        assert_eq!(shape.last(), Some(&k), "{INT8_KERNEL_NAME}: x of shape {shape:?} times a [{k}, {n}] weight");
        let rows: usize = shape[..shape.len() - 1].iter().product();
        *shape.last_mut().expect("rank >= 2") = n;
        let x = x.to_standard();
        let a = x.array::<f32>().expect("an f32 activation (checked when quantized)");
        let a = a.view().into_shape_with_order((rows, k)).expect("standard layout");
        let mut c = vec![0.0f32; rows * n];
        gemm_dynamic_i8(a, packed, &mut c, false, isa);
        vec![Storage::from_vec(c, &shape).expect("sized above")]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kernels multiplying by one weight buffer share its quantized form,
    /// a buffer of equal values does not take it, it goes with the last
    /// kernel holding it, and a shared form gives the kernel's own bits.
    #[test]
    fn kernels_share_a_weights_quantized_form_by_its_buffer() {
        let values: Vec<f32> = (0..7 * 3).map(|i| (i as f32 * 0.37).sin()).collect();
        let w = Storage::from_vec(values.clone(), &[7, 3]).unwrap();
        let twin = Storage::from_vec(values, &[7, 3]).unwrap();
        let (p, q) = (DynamicI8::default(), DynamicI8::default());
        let (pw, qw) = (p.weight(&w), q.weight(&w));
        assert!(Arc::ptr_eq(&pw, &qw));
        assert!(!Arc::ptr_eq(&pw, &q.weight(&twin)));
        let x = Storage::from_vec((0..5 * 7).map(|i| (i as f32 * 0.11).cos()).collect(), &[5, 7]).unwrap();
        let (shared, own) = (p.run(&[x.clone(), w.clone()], Isa::native()), q.run(&[x, twin], Isa::native()));
        assert!(shared[0].bit_eq(&own[0]), "equal weights, equal products");
        let weak = Arc::downgrade(&pw);
        drop((pw, qw, p));
        assert!(weak.upgrade().is_none(), "the quantized weight outlived its kernels");
    }
}
