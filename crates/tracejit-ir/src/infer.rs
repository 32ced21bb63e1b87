//! Shape and dtype inference: the single statement of what every op accepts
//! and what it returns, for partially known shapes. Eager mode calls it
//! before running a kernel, so its error messages are the ones users see.
//!
//! Unknown dimensions (`None`) are accepted wherever a known size could be
//! valid; the check then happens at run time (the interpreter re-runs
//! inference on the concrete types). Inference never guesses: an output
//! dimension is known only when every value the inputs can take agrees on it.
//! Messages have the form `{op}: {what}` and name the dtypes and shapes
//! involved (`add: cannot broadcast [3, 4] with [5] (f32 and f32)`).

use smallvec::{smallvec, SmallVec};
use tracejit_tensor::DType;

use crate::{Dim, Dims, DimsDisplay, FuncId, Graph, Op, OpError, TensorType};

mod elementwise;
mod reduce;
mod shape;
mod spatial;
mod state;
mod window;

/// The output types of one node.
type Outputs = SmallVec<[TensorType; 1]>;

/// The output types of `op` applied to inputs of types `inputs`. `graph` is
/// needed for `Call` (the library) and variable ops; eager callers pass `None`.
///
/// A fully known result whose size overflows (more elements than `usize`
/// counts, or more than `isize::MAX` bytes) is an error naming the op and
/// the input types, so no executor ever computes with a wrapped size.
pub fn infer(op: &Op, inputs: &[TensorType], graph: Option<&Graph>) -> Result<SmallVec<[TensorType; 1]>, OpError> {
    let outputs = infer_types(op, inputs, graph)?;
    for t in &outputs {
        if let Some(shape) = t.shape() {
            if tracejit_tensor::byte_size(t.dtype, &shape).is_none() {
                return Err(OpError::new(
                    op.name(),
                    format!(
                        "the result {t} is too large: its size overflows (more than isize::MAX bytes){}",
                        inputs_text(inputs)
                    ),
                ));
            }
        }
    }
    Ok(outputs)
}

/// ` (inputs f32[2], f32[3])`, or nothing for an op without inputs.
pub(crate) fn inputs_text(inputs: &[TensorType]) -> String {
    if inputs.is_empty() {
        return String::new();
    }
    let types: Vec<String> = inputs.iter().map(ToString::to_string).collect();
    format!(" (input{} {})", if inputs.len() == 1 { "" } else { "s" }, types.join(", "))
}

/// `Ok` when every fully known output of `op` can be allocated now (see
/// [`tracejit_tensor::check_allocation`]); else an error naming the op, the
/// result and the inputs. Executors call it before running an op with a
/// big result, so a huge shape is an error, never an abort.
pub fn check_outputs_allocatable(op: &Op, inputs: &[TensorType], outputs: &[TensorType]) -> Result<(), OpError> {
    for t in outputs {
        // The common case, a small result, allocates nothing here.
        let small = t.num_elements().and_then(|n| n.checked_mul(t.dtype.size_of()));
        if small.is_some_and(|b| b < tracejit_tensor::PROBE_BYTES) || t.dims.iter().any(Option::is_none) {
            continue;
        }
        if let Some(shape) = t.shape() {
            if let Err(e) = tracejit_tensor::check_allocation(t.dtype, &shape) {
                return Err(OpError::new(
                    op_label(op),
                    format!("cannot allocate the result: {e}{}", inputs_text(inputs)),
                ));
            }
        }
    }
    Ok(())
}

/// The op's name, and for a fused region the ops it runs:
/// `fused region (broadcast_to, mul)`.
fn op_label(op: &Op) -> String {
    let Op::Fused { body } = op else { return op.name().to_string() };
    let mut names: Vec<&str> = Vec::new();
    for (_, n) in body.nodes() {
        if !n.op.is_source() && !names.contains(&n.op.name()) {
            names.push(n.op.name());
        }
    }
    format!("fused region ({})", names.join(", "))
}

/// The output types of `op` on inputs of types `inputs`: one rule per
/// op, grouped by family in `infer/`.
fn infer_types(op: &Op, inputs: &[TensorType], graph: Option<&Graph>) -> Result<Outputs, OpError> {
    let name = op.name();
    let err = |message: String| OpError::new(name, message);
    if let Some(n) = op.num_inputs() {
        if inputs.len() != n {
            return Err(err(format!("expected {}, got {}", count(n, "input"), inputs.len())));
        }
    }
    let one = |t: TensorType| -> Result<Outputs, OpError> { Ok(smallvec![t]) };

    match op {
        Op::Parameter { .. } => Err(err("parameters are created by Graph::add_param, not inferred".into())),
        Op::Constant { value } => one(TensorType::known(value.dtype(), value.shape())),
        Op::Unary(u) => elementwise::unary(*u, inputs).map_err(err),
        Op::Binary(b) => elementwise::binary(*b, inputs).map_err(err),
        Op::Select => elementwise::select(inputs).map_err(err),
        Op::Cast { to } => one(TensorType { dtype: *to, dims: inputs[0].dims.clone() }),
        Op::Clamp { min, max } => elementwise::clamp(min, max, inputs).map_err(err),
        Op::Reduce { op: r, axes, keepdims } => reduce::reduce(name, r, axes, keepdims, inputs).map_err(err),
        Op::ArgReduce { axis, keepdims, .. } => reduce::arg_reduce(axis, keepdims, inputs).map_err(err),
        Op::MatMul => reduce::matmul(inputs).map_err(err),
        Op::Reshape { shape } => shape::reshape(shape, inputs).map_err(err),
        Op::Transpose { perm } => shape::transpose(perm, inputs).map_err(err),
        Op::BroadcastTo { shape } => shape::broadcast_to(shape, inputs).map_err(err),
        Op::ExpandDims { axis } => shape::expand_dims(axis, inputs).map_err(err),
        Op::Squeeze { axes } => shape::squeeze(axes, inputs).map_err(err),
        Op::Concat { axis } => shape::concat(axis, inputs).map_err(err),
        Op::Stack { axis } => shape::stack(axis, inputs).map_err(err),
        Op::Slice { specs } => shape::slice(specs, inputs).map_err(err),
        Op::Gather { axis } => shape::gather(axis, inputs).map_err(err),
        Op::OneHot { depth, dtype } => shape::one_hot(depth, dtype, inputs).map_err(err),
        Op::GatherElements { axis } => window::gather_elements(*axis, inputs).map_err(err),
        Op::ScatterAdd { axis } => window::scatter_add(*axis, inputs).map_err(err),
        Op::DynamicSlice { sizes } => window::dynamic_slice(sizes, inputs).map_err(err),
        Op::DynamicUpdateSlice => window::dynamic_update_slice(inputs).map_err(err),
        Op::Pad { pads, .. } => window::pad(pads, inputs).map_err(err),
        Op::Cumsum { axis } => window::cumsum(*axis, inputs).map_err(err),
        Op::TopK { k } => window::top_k(*k, inputs).map_err(err),
        Op::Random { dtype, shape, .. } => window::random(*dtype, shape.as_deref(), inputs).map_err(err),
        Op::Spatial(sp) => spatial::spatial(sp, inputs).map_err(err),
        Op::Call { func } => {
            let graph = graph.ok_or_else(|| err("needs the calling graph (its function library)".into()))?;
            infer_call(*func, inputs, graph).map_err(err)
        }
        Op::Fused { body } => infer_body("fused region", body, inputs).map_err(err),
        Op::Cond { branches } => infer_cond(branches, inputs).map_err(err),
        Op::While { parts, .. } => infer_while(parts, inputs).map_err(err),
        Op::Kernel { name: kernel, inputs: accepted, outputs, .. } => {
            state::kernel(kernel, accepted, outputs, inputs).map_err(err)
        }
        Op::ReadVariable { var, .. } => state::read_variable(var, graph).map_err(err),
        Op::AssignVariable { var, kind, .. } => state::assign_variable(var, kind, inputs, graph).map_err(err),
    }
}

/// numpy broadcasting of two partially known shapes: right-aligned, each pair
/// of dims equal or one of them 1. An unknown dim meeting a 1 stays unknown;
/// meeting a known `n != 1` it becomes `n` (the only size that can work).
/// `None` if the shapes can never broadcast.
pub fn broadcast_dims(a: &[Dim], b: &[Dim]) -> Option<Dims> {
    let rank = a.len().max(b.len());
    let at = |s: &[Dim], i: usize| if i < rank - s.len() { Some(1) } else { s[i - (rank - s.len())] };
    (0..rank)
        .map(|i| match (at(a, i), at(b, i)) {
            (Some(x), Some(y)) if x == y || y == 1 => Some(Some(x)),
            (Some(1), Some(y)) => Some(Some(y)),
            (Some(_), Some(_)) => None,
            (None, Some(1)) | (Some(1), None) | (None, None) => Some(None),
            (None, Some(n)) | (Some(n), None) => Some(Some(n)),
        })
        .collect()
}

/// Resolves a reshape target (at most one `-1`, no other negative) against a
/// known element count; the error says what does not fit.
pub(crate) fn resolve_reshape(target: &[i64], count: usize) -> Result<Vec<usize>, String> {
    check_reshape_target(target)?;
    let known_dims: Vec<usize> = target.iter().filter(|&&d| d >= 0).map(|&d| d as usize).collect();
    let known = tracejit_tensor::element_count(&known_dims)
        .ok_or_else(|| format!("the target shape {target:?} has more elements than usize can count"))?;
    let hole = target.iter().position(|&d| d == -1);
    let fill = match hole {
        Some(_) if known == 0 => {
            return Err(format!("cannot infer the -1 in {target:?} from {count} elements: the other dims hold 0"))
        }
        Some(_) if !count.is_multiple_of(known) => {
            return Err(format!(
                "cannot reshape {count} elements into {target:?}: {count} is not a multiple of {known}"
            ))
        }
        Some(_) => count / known,
        None if known != count => {
            return Err(format!("cannot reshape {count} elements into {target:?} ({known} elements)"))
        }
        None => 0,
    };
    Ok(target.iter().map(|&d| if d == -1 { fill } else { d as usize }).collect())
}

/// At most one `-1` and no other negative dim.
fn check_reshape_target(target: &[i64]) -> Result<(), String> {
    if let Some(d) = target.iter().find(|&&d| d < -1) {
        return Err(format!("invalid dimension {d} in the target shape {target:?}"));
    }
    if target.iter().filter(|&&d| d == -1).count() > 1 {
        return Err(format!("the target shape {target:?} has more than one -1"));
    }
    Ok(())
}

/// Types the call of library function `func` on arguments of types `inputs`.
fn infer_call(func: FuncId, inputs: &[TensorType], graph: &Graph) -> Result<Outputs, String> {
    if func.as_u32() as usize >= graph.library.len() {
        return Err(format!("unknown function {func}"));
    }
    let f = graph.library.get(func);
    infer_body(&format!("function {func} \"{}\"", f.name), &f.graph, inputs)
}

/// The outputs of a nested graph (a callee or a fused region's body) given
/// the types of its arguments.
fn infer_body(what: &str, body: &Graph, inputs: &[TensorType]) -> Result<Outputs, String> {
    let params = body.param_types();
    if params.len() != inputs.len() {
        return Err(format!("{what} takes {}, got {}", count(params.len(), "argument"), inputs.len()));
    }
    for (i, (p, x)) in params.iter().zip(inputs).enumerate() {
        if !dims_compatible(p, x) {
            return Err(format!("argument {i} of {what} has type {x}, but it takes {p}"));
        }
    }
    Ok(body.output_types().into_iter().collect())
}

/// A conditional's outputs: what both branches can return (a dim the two
/// branches give differently is unknown). The predicate must be a bool
/// scalar and the branches must agree on dtypes and ranks.
fn infer_cond(branches: &[std::sync::Arc<Graph>; 2], inputs: &[TensorType]) -> Result<Outputs, String> {
    let pred = &inputs[0];
    if pred.dtype != DType::Bool || pred.rank() != 0 {
        return Err(format!("the predicate must be a bool scalar, got {pred}"));
    }
    let then = infer_body("the then branch", &branches[0], &inputs[1..])?;
    let other = infer_body("the else branch", &branches[1], &inputs[1..])?;
    if then.len() != other.len() {
        return Err(format!("the then branch returns {} values, the else branch {}", then.len(), other.len()));
    }
    then.iter()
        .zip(&other)
        .enumerate()
        .map(|(i, (a, b))| {
            join_types(a, b).ok_or_else(|| format!("output {i}: the then branch returns {a}, the else branch {b}"))
        })
        .collect()
}

/// The type of values of either `a` or `b`: same dtype and rank, a dim
/// unknown where they differ; `None` when the dtypes or ranks differ.
pub fn join_types(a: &TensorType, b: &TensorType) -> Option<TensorType> {
    if a.dtype != b.dtype || a.rank() != b.rank() {
        return None;
    }
    let dims = a.dims.iter().zip(&b.dims).map(|(&x, &y)| if x == y { x } else { None }).collect();
    Some(TensorType { dtype: a.dtype, dims })
}

/// A loop's outputs: the carried values, whose types the body must keep
/// (the condition returns a bool scalar).
fn infer_while(parts: &[std::sync::Arc<Graph>; 2], inputs: &[TensorType]) -> Result<Outputs, String> {
    let [cond, body] = parts;
    if cond.params.len() != body.params.len() {
        return Err(format!(
            "the condition takes {}, the body {}",
            count(cond.params.len(), "argument"),
            count(body.params.len(), "argument")
        ));
    }
    let carried = body.outputs.len();
    if carried > inputs.len() {
        return Err(format!("the body returns {carried} carried values but the loop has {} inputs", inputs.len()));
    }
    let c = infer_body("the condition", cond, inputs)?;
    if c.len() != 1 || c[0].dtype != DType::Bool || c[0].rank() != 0 {
        let got: Vec<String> = c.iter().map(|t| t.to_string()).collect();
        return Err(format!("the condition must return one bool scalar, got ({})", got.join(", ")));
    }
    let next = infer_body("the body", body, inputs)?;
    let params = body.param_types();
    for (i, (p, n)) in params.iter().zip(&next).enumerate() {
        if !p.is_compatible_with(n) {
            return Err(format!(
                "carried value {i} enters the loop as {p} but the body returns {n}; loop-carried values must keep \
                 their dtype and shape"
            ));
        }
    }
    Ok(params[..carried].iter().cloned().collect())
}

/// Same dtype and rank, and each pair of dims equal or one unknown: some
/// value fits both types.
fn dims_compatible(a: &TensorType, b: &TensorType) -> bool {
    a.dtype == b.dtype && a.rank() == b.rank() && a.dims.iter().zip(&b.dims).all(|(&x, &y)| merge_dim(x, y).is_some())
}

/// The common value of two dims that must be equal (unknown takes the known
/// one); `None` when they are known and differ.
fn merge_dim(a: Dim, b: Dim) -> Option<Dim> {
    match (a, b) {
        (Some(x), Some(y)) if x != y => None,
        (Some(x), _) | (_, Some(x)) => Some(Some(x)),
        (None, None) => Some(None),
    }
}

/// Inputs of a variadic op (concat, stack) must agree on dtype and rank.
fn check_same_dtype_rank(first: &TensorType, x: &TensorType) -> Result<(), String> {
    if x.dtype != first.dtype {
        return Err(format!("inputs have different dtypes {first} and {x}"));
    }
    if x.rank() != first.rank() {
        return Err(format!("inputs have different ranks {first} and {x}"));
    }
    Ok(())
}

fn check_axis(axis: usize, x: &TensorType) -> Result<(), String> {
    if axis >= x.rank() {
        return Err(format!("axis {axis} is out of range for {x}"));
    }
    Ok(())
}

/// Axes sorted, unique and in range.
fn check_axes(axes: &[usize], x: &TensorType) -> Result<(), String> {
    for &a in axes {
        check_axis(a, x)?;
    }
    if axes.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("axes {axes:?} must be sorted and unique (for {x})"));
    }
    Ok(())
}

fn is_permutation(perm: &[usize], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    perm.len() == rank && perm.iter().all(|&p| p < rank && !std::mem::replace(&mut seen[p], true))
}

/// Describes the dtypes an op accepts: `float`, `numeric`, `bool` or a list.
fn accepted_kind(accepts: impl Fn(DType) -> bool) -> String {
    let ok: Vec<DType> = DType::ALL.into_iter().filter(|&d| accepts(d)).collect();
    let all = |f: fn(DType) -> bool| DType::ALL.into_iter().filter(|&d| f(d)).collect::<Vec<_>>();
    if ok == all(DType::is_float) {
        "float".into()
    } else if ok == all(DType::is_numeric) {
        "numeric".into()
    } else if ok == all(DType::is_int) {
        "integer".into()
    } else if ok == all(DType::is_index) {
        "i32/i64".into()
    } else {
        ok.iter().map(|d| d.name()).collect::<Vec<_>>().join("/")
    }
}

/// `a float`, `an integer`.
fn with_article(kind: String) -> String {
    let article = if kind.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" };
    format!("{article} {kind}")
}

/// `1 input`, `2 inputs`.
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
