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
//! Which products go to int8 is decided by the IR's precision pass
//! (`auto_mixed_precision` with `PassContext::int8_products`, the pass that
//! also picks bf16), run over the function's optimized graph, verified and
//! dumped like the pipeline's passes; the executable is then built for the
//! function's own target.
//!
//! The error of each output is at most about `2⁻⁷` of the row's largest
//! |activation| times the column's largest |weight| per term (the two
//! roundings), so results agree with f32 to about 1e-2 of the output's
//! magnitude (see `tracejit_kernels::int8`).

use std::sync::{Arc, OnceLock};

use tracejit_ir::passes::{AutoMixedPrecision, Dce, PassContext, Pipeline, Stage};
use tracejit_kernels::int8::MAX_K;

use crate::{ConcreteFunction, Error, Result};

/// The name of the quantized product's kernel in graph listings.
pub const KERNEL_NAME: &str = tracejit_ir::passes::INT8_KERNEL_NAME;

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
    let census = tracejit_ir::passes::int8_census(&cf.optimized);
    if census.eligible == 0 {
        let message = if census.products == 0 {
            "it has no matrix product".to_string()
        } else {
            format!(
                "none of its {} matrix product(s) multiplies by a variable or a constant (both operands computed, \
                 or not f32 with a [k, n] right operand of k <= {MAX_K})",
                census.products
            )
        };
        return Err(Error::Quantize { function: cf.name.clone(), message });
    }
    // The precision pass in int8, then the roundings a mixed-precision
    // trace put on the products' operands are left without readers (int8
    // reads the f32 values): verified and dumped like the pipeline's passes
    // (`TRACEJIT_DUMP`, as `<function>.int8`).
    let pipeline = Pipeline::new(vec![Stage::pass(AutoMixedPrecision), Stage::pass(Dce)]);
    let cx = PassContext {
        dump_prefix: Some(format!("{}.int8", cf.name)),
        int8_products: true,
        ..PassContext::new(cf.name.clone())
    };
    let (optimized, _report) = pipeline.run(&cf.optimized, &cx)?;
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
        trace_reason: format!("{} (quantized: {} products in int8)", cf.trace_reason, census.eligible),
        report: cf.report.clone(),
        prepared: prepared.into(),
        preparer: None,
        differentiable: OnceLock::new(),
        last_used: std::sync::atomic::AtomicU64::new(0),
    }))
}
