//! Dynamic int8 quantization of a traced function, for inference (PyTorch's
//! `quantize_dynamic`, ONNX Runtime's dynamic quantization): every f32
//! product whose right operand is a variable's value or a constant (or its
//! transpose) runs in int8 on `vpdpbusd` where the CPU has AVX-512 VNNI.
//!
//! - Weights: symmetric int8 with one scale per output column, quantized
//!   once per weight version (the packed form is kept while the variable's
//!   buffer is the same, so an assignment re-quantizes on the next call).
//! - Activations: int8 with one scale per row, computed at run time.
//! - Everything else stays f32, and the result is f32. That includes a
//!   product with the weight on the left (`w @ x`: write `x @ wᵀ`, or
//!   transpose around it) and a batched weight (rank above 2, one matrix
//!   per batch entry): neither has per-output-column scales of one matrix,
//!   so they are left as they are, and a function with only such products
//!   is the "nothing to quantize" error, which names them.
//!
//! The error of each output is at most about `2⁻⁷` of the row's largest
//! |activation| times the column's largest |weight| per term (the two
//! roundings), so results agree with f32 to about 1e-2 of the output's
//! magnitude (see `tracejit_kernels::int8`).

use std::sync::{Arc, Mutex, OnceLock};

use tracejit_ir::{ExternalKernel, Graph, NodeId, Op, TensorType, ValueId};
use tracejit_kernels::int8::{gemm_dynamic_i8, PackedI8, MAX_K};
use tracejit_kernels::Isa;
use tracejit_tensor::{DType, Storage};

use crate::{ConcreteFunction, Error, Result};

/// The name of the quantized product's kernel in graph listings.
pub const KERNEL_NAME: &str = "tracejit.quantize.matmul_dynamic_i8";

/// `cf` with its products against variables or constants in int8: same
/// signature, same results up to quantization error, run with
/// [`ConcreteFunction::call_flat`] like any other.
///
/// ```
/// use tracejit_trace::{function, quantize, Tensor, Variable};
///
/// let w = Variable::new(Tensor::randn(&[64, 16], 0));
/// let f = { let w = w.clone(); function(move |x: Tensor| x.matmul(&w.read()).relu()) };
/// let x = Tensor::randn(&[8, 64], 1);
/// let cf = f.get_concrete_function(x.clone())?;
/// let q = quantize::dynamic(&cf)?;
/// let (exact, approx) = (cf.call_flat(&[x.clone()])?, q.call_flat(&[x])?);
/// let err = (&exact[0] - &approx[0]).abs().max_all().to_vec::<f32>()?[0];
/// let scale = exact[0].abs().max_all().to_vec::<f32>()?[0];
/// assert!(err < 0.03 * scale, "{err} of {scale}");
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
///
/// # Errors
/// [`Error::Quantize`] when `cf` has no f32 product against a variable or
/// a constant (nothing to quantize), naming the products it found.
pub fn dynamic(cf: &ConcreteFunction) -> Result<Arc<ConcreteFunction>> {
    let mut optimized = (*cf.optimized).clone();
    let mut seen = Seen::default();
    quantize_graph(&mut optimized, &mut seen);
    // The roundings a mixed-precision trace put on the products' operands
    // are left without readers: int8 reads the f32 values.
    let cx = tracejit_ir::passes::PassContext::new(cf.name.clone());
    tracejit_ir::passes::Pass::run(&tracejit_ir::passes::Dce, &mut optimized, &cx);
    if seen.quantized == 0 {
        let message = if seen.products == 0 {
            "it has no matrix product".to_string()
        } else {
            format!(
                "none of its {} matrix product(s) multiplies by a variable or a constant (both operands computed, \
                 or not f32 with a [k, n] right operand of k <= {MAX_K})",
                seen.products
            )
        };
        return Err(Error::Quantize { function: cf.name.clone(), message });
    }
    let optimized = Arc::new(optimized);
    let prepared = match cf.executable() {
        None => (None, None),
        Some(exe) => match tracejit_jit::Executable::with_options(
            &optimized,
            &tracejit_jit::JitOptions::global().for_target(exe.target()),
        ) {
            Ok(e) => (Some(e), None),
            Err(e) => (None, Some(e.to_string())),
        },
    };
    Ok(Arc::new(ConcreteFunction {
        name: format!("{}.int8", cf.name),
        graph: cf.graph.clone(),
        optimized,
        signature: cf.signature.clone(),
        statics: cf.statics.clone(),
        structure: cf.structure.clone(),
        captures: cf.captures.clone(),
        implicit_inputs: cf.implicit_inputs.clone(),
        output_statics: cf.output_statics.clone(),
        output_structure: cf.output_structure.clone(),
        input_paths: cf.input_paths.clone(),
        output_paths: cf.output_paths.clone(),
        attrs: cf.attrs.clone(),
        target: cf.target,
        trace_reason: format!("{} (quantized: {} products in int8)", cf.trace_reason, seen.quantized),
        report: cf.report.clone(),
        prepared: prepared.into(),
        preparer: None,
        differentiable: OnceLock::new(),
        last_used: std::sync::atomic::AtomicU64::new(0),
    }))
}

/// Products found and quantized.
#[derive(Default)]
struct Seen {
    products: usize,
    quantized: usize,
}

/// Replaces the eligible products of `g` and of its loops' and branches'
/// bodies by the int8 kernel.
fn quantize_graph(g: &mut Graph, seen: &mut Seen) {
    let ids: Vec<NodeId> = g.nodes().map(|(id, _)| id).collect();
    for id in ids {
        let node = g.node(id);
        // Only products change; loops and branches are searched too. (Calls
        // were inlined by the pipeline; fused regions hold no product.)
        let op = if matches!(node.op, Op::MatMul) {
            seen.products += 1;
            if !eligible(g, id) {
                continue;
            }
            seen.quantized += 1;
            let operands: Vec<ValueId> = node.inputs.iter().map(|&v| unrounded(g, v)).collect();
            let inputs: Vec<TensorType> = operands.iter().map(|v| g.value_type(*v).clone()).collect();
            let op = Op::Kernel {
                name: KERNEL_NAME.to_string(),
                kernel: Arc::new(DynamicI8::default()),
                inputs,
                outputs: node.outputs.to_vec(),
            };
            let node = g.node_mut(id);
            node.inputs = operands.into_iter().collect();
            node.op = op;
            continue;
        } else if let Op::While { parts, trip_count, cancel } = &node.op {
            Op::While {
                parts: [sub(&parts[0], seen), sub(&parts[1], seen)],
                trip_count: *trip_count,
                cancel: cancel.clone(),
            }
        } else if let Op::Cond { branches } = &node.op {
            Op::Cond { branches: [sub(&branches[0], seen), sub(&branches[1], seen)] }
        } else {
            continue;
        };
        g.node_mut(id).op = op;
    }
}

/// A quantized copy of a subgraph.
fn sub(g: &Arc<Graph>, seen: &mut Seen) -> Arc<Graph> {
    let mut copy = (**g).clone();
    quantize_graph(&mut copy, seen);
    Arc::new(copy)
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
/// what `mixed_precision` puts on a product's operands), else `v`.
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

/// The int8 product kernel: `x [.., k] · w [k, n]`, the weight quantized
/// once per buffer, the activations per row on each call.
#[derive(Default)]
struct DynamicI8 {
    /// The last weight and its quantized form (the weight is held so its
    /// buffer cannot be reused for another value while cached).
    packed: Mutex<Option<(Storage, Arc<PackedI8>)>>,
}

impl std::fmt::Debug for DynamicI8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DynamicI8")
    }
}

impl DynamicI8 {
    fn weight(&self, w: &Storage) -> Arc<PackedI8> {
        let mut cached = self.packed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((held, p)) = cached.as_ref() {
            if held.same_elements(w) {
                return p.clone();
            }
        }
        let a = w.array::<f32>().expect("an f32 weight (checked when quantized)");
        let p = Arc::new(PackedI8::quantize(a.view().into_dimensionality().expect("a [k, n] weight")));
        *cached = Some((w.clone(), p.clone()));
        p
    }
}

impl ExternalKernel for DynamicI8 {
    fn run(&self, inputs: &[Storage], isa: Isa) -> Vec<Storage> {
        let (x, w) = (&inputs[0], &inputs[1]);
        let packed = self.weight(w);
        let (k, n) = (packed.k(), packed.n());
        let mut shape = x.shape().to_vec();
        assert_eq!(shape.last(), Some(&k), "{KERNEL_NAME}: x of shape {shape:?} times a [{k}, {n}] weight");
        let rows: usize = shape[..shape.len() - 1].iter().product();
        *shape.last_mut().expect("rank >= 2") = n;
        let x = x.to_standard();
        let a = x.array::<f32>().expect("an f32 activation (checked when quantized)");
        let a = a.view().into_shape_with_order((rows, k)).expect("standard layout");
        let mut c = vec![0.0f32; rows * n];
        gemm_dynamic_i8(a, &packed, &mut c, false, isa);
        vec![Storage::from_vec(c, &shape).expect("sized above")]
    }
}
