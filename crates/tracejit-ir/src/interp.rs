//! The interpreter: runs a graph node by node with the reference kernels. It
//! is the oracle every optimization and the JIT are tested against, and
//! `eval_primitive` is also what eager mode runs for each op.
//!
//! Before each primitive or variable node runs, the interpreter re-runs
//! [`infer`] on the concrete types of its inputs. A graph traced with unknown
//! dimensions can only be checked fully at run time: `f32[?] + f32[3]` run
//! with 4 elements, or a `reshape` to `[2, 2]` of an input whose size was
//! unknown, becomes an [`IrError::Op`] naming the op and the concrete shapes
//! (`add: cannot broadcast [4] with [3] (f32 and f32)`) instead of a panic inside a
//! kernel. Every result is also checked against its node's declared type; a
//! mismatch there is an [`IrError::Verifier`] (a bug, not a user error).
//! Values are dropped after their last use, so peak memory follows liveness.

use cranelift_entity::EntityRef;
use smallvec::SmallVec;
use tracejit_tensor::{kernels, BinaryOp, Storage};

use crate::infer::resolve_reshape;
use crate::primitive_ops;
use crate::{infer, AssignKind, Graph, IrError, Op, TensorType};

/// Runs a primitive op (anything but `Parameter`, `Call` and variable ops) on
/// concrete inputs. Inputs were type-checked by [`crate::infer`].
///
/// # Panics
///
/// On a non-primitive op, on the wrong number of inputs, and (like the
/// kernels) on operands that [`crate::infer`] would reject. A `reshape` whose
/// target does not hold the input's element count panics with a message
/// naming both. A `Fused` region runs its body with [`interpret`]; a
/// `Kernel` runs its native code, and panics naming the kernel if the
/// results do not fit its declared output types.
pub fn eval_primitive(op: &Op, inputs: &[&Storage]) -> Vec<Storage> {
    if let Some(n) = op.num_inputs() {
        assert_eq!(inputs.len(), n, "{}: expected {n} inputs, got {}", op.name(), inputs.len());
    }
    // A region is self-contained, so executors that fall back to this
    // function for ops they do not compile still run it correctly.
    if let Op::Fused { body } = op {
        let owned: Vec<Storage> = inputs.iter().map(|s| (*s).clone()).collect();
        return match interpret(body, &owned) {
            Ok(outs) => outs,
            Err(e) => panic!("fused region: {e}"),
        };
    }
    // Control flow runs its subgraphs, like a region its body.
    if let Op::Cond { .. } | Op::While { .. } = op {
        let owned: Vec<Storage> = inputs.iter().map(|s| (*s).clone()).collect();
        return match run_control(op, &owned) {
            Ok(outs) => outs,
            Err(e) => panic!("{}: {e}", op.name()),
        };
    }
    if let Op::Kernel { .. } = op {
        return eval_kernel(op, inputs, tracejit_kernels::Isa::current());
    }
    // The one op of two outputs.
    if let Op::TopK { k } = op {
        let (values, indices) = kernels::top_k(inputs[0], *k);
        return vec![values, indices];
    }
    // Spatial ops may return two values (a filter gradient with the
    // bias's).
    if let Op::Spatial(sp) = op {
        return kernels::spatial(sp, inputs);
    }
    let out = match op {
        Op::Fused { .. }
        | Op::Kernel { .. }
        | Op::Cond { .. }
        | Op::While { .. }
        | Op::TopK { .. }
        | Op::Spatial(_) => {
            unreachable!("handled above")
        }
        Op::Parameter { .. } | Op::Call { .. } | Op::ReadVariable { .. } | Op::AssignVariable { .. } => {
            panic!("eval_primitive: `{}` is not a primitive op; interpret the graph that holds it", op.name())
        }
        Op::Constant { value } => value.clone(),
        Op::Unary(u) => kernels::unary(*u, inputs[0]),
        Op::Binary(b) => kernels::binary(*b, inputs[0], inputs[1]),
        Op::Select => kernels::select(inputs[0], inputs[1], inputs[2]),
        Op::Cast { to } => kernels::cast(inputs[0], *to),
        Op::Clamp { min, max } => kernels::clamp(inputs[0], *min, *max),
        Op::Reduce { op, axes, keepdims } => kernels::reduce(*op, inputs[0], axes, *keepdims),
        Op::ArgReduce { op, axis, keepdims } => kernels::arg_reduce(*op, inputs[0], *axis, *keepdims),
        Op::MatMul => kernels::matmul(inputs[0], inputs[1]),
        Op::Reshape { shape } => {
            let x = inputs[0];
            let target = resolve_reshape(shape, x.len()).unwrap_or_else(|m| {
                panic!("reshape: {m} (the input has shape {:?} and dtype {})", x.shape(), x.dtype())
            });
            kernels::reshape(x, &target)
        }
        Op::Transpose { perm } => kernels::transpose(inputs[0], perm),
        Op::BroadcastTo { shape } => kernels::broadcast_to(inputs[0], shape),
        Op::ExpandDims { axis } => {
            let mut shape = inputs[0].shape().to_vec();
            shape.insert(*axis, 1);
            kernels::reshape(inputs[0], &shape)
        }
        Op::Squeeze { axes } => {
            let shape: Vec<usize> =
                inputs[0].shape().iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
            kernels::reshape(inputs[0], &shape)
        }
        Op::Concat { axis } => kernels::concat(inputs, *axis),
        Op::Stack { axis } => kernels::stack(inputs, *axis),
        Op::Slice { specs } => kernels::slice(inputs[0], specs),
        Op::Gather { axis } => kernels::gather(inputs[0], inputs[1], *axis),
        Op::OneHot { depth, dtype } => kernels::one_hot(inputs[0], *depth, *dtype),
        Op::GatherElements { axis } => kernels::gather_elements(inputs[0], inputs[1], *axis),
        Op::ScatterAdd { axis } => kernels::scatter_add(inputs[0], inputs[1], inputs[2], *axis),
        Op::DynamicSlice { sizes } => kernels::dynamic_slice(inputs[0], inputs[1], sizes),
        Op::DynamicUpdateSlice => kernels::dynamic_update_slice(inputs[0], inputs[1], inputs[2]),
        Op::Pad { pads, value } => kernels::pad(inputs[0], pads, *value),
        Op::Cumsum { axis } => kernels::cumsum(inputs[0], *axis),
        Op::Random { dist, dtype, shape } => {
            let shape = shape.as_deref().unwrap_or_else(|| inputs[1].shape());
            kernels::random(*dist, inputs[0], shape, *dtype)
        }
    };
    vec![out]
}

/// Runs `graph` on `inputs` (one per parameter, checked against the
/// parameter types) and returns its outputs.
///
/// Errors: [`IrError::BadInput`] for a wrong input count, dtype or shape;
/// [`IrError::Op`] when a node's concrete operands do not fit its op (only
/// possible where the graph has unknown dims); [`IrError::Verifier`] when the
/// graph itself is broken.
pub fn interpret(graph: &Graph, inputs: &[Storage]) -> Result<Vec<Storage>, IrError> {
    let bad_input = |message: String| IrError::BadInput { graph: graph.name.clone(), message };
    if inputs.len() != graph.params.len() {
        return Err(bad_input(format!("expected {} inputs, got {}", graph.params.len(), inputs.len())));
    }
    if let Some(&p) = graph.params.iter().find(|p| p.index() >= graph.len()) {
        let message = "a parameter refers to a missing node".to_string();
        return Err(IrError::Verifier { graph: graph.name.clone(), node: p, message });
    }
    for (i, (ty, x)) in graph.param_types().iter().zip(inputs).enumerate() {
        if !ty.accepts(x.dtype(), x.shape()) {
            return Err(bad_input(format!("input {i}: expected {ty}, got {}", concrete_type(x))));
        }
    }

    // The last node that reads each node's outputs; graph outputs live on.
    let n = graph.len();
    let mut last_use: Vec<usize> = (0..n).collect();
    for (id, node) in graph.nodes() {
        for v in &node.inputs {
            if v.node.index() < n {
                last_use[v.node.index()] = last_use[v.node.index()].max(id.index());
            }
        }
    }
    for v in &graph.outputs {
        if v.node.index() < n {
            last_use[v.node.index()] = usize::MAX;
        }
    }

    let mut values: Vec<Option<SmallVec<[Storage; 1]>>> = vec![None; n];
    // Locked updates hold their variables' locks as the JIT's runs do.
    let plan = crate::locks::LockPlan::new(graph.nodes().map(|(_, n)| &n.op), graph);
    let mut held = plan.as_ref().map(crate::locks::LockPlan::start);
    for (step, (id, node)) in graph.nodes().enumerate() {
        if let Some(held) = held.as_mut() {
            held.before(step);
        }
        let broken = |message: String| IrError::Verifier { graph: graph.name.clone(), node: id, message };
        // A kernel that panics on its values names this node's line.
        crate::note_running(node.location);
        let mut args: SmallVec<[Storage; 2]> = SmallVec::new();
        for (i, v) in node.inputs.iter().enumerate() {
            let value = values
                .get(v.node.index())
                .and_then(|outs| outs.as_ref())
                .and_then(|outs| outs.get(v.index as usize))
                .ok_or_else(|| broken(format!("input {i} ({v}) is not available when the node runs")))?;
            args.push(value.clone());
        }

        let outs: SmallVec<[Storage; 1]> = match &node.op {
            Op::Parameter { index } => {
                let x = inputs.get(*index).ok_or_else(|| broken(format!("parameter index {index} out of range")))?;
                smallvec::smallvec![x.clone()]
            }
            Op::Call { func } => {
                if func.index() >= graph.library.len() {
                    return Err(broken(format!("unknown function {func}")));
                }
                interpret(&graph.library.get(*func).graph, &args)?.into_iter().collect()
            }
            Op::Fused { body } => interpret(body, &args)?.into_iter().collect(),
            Op::Cond { .. } | Op::While { .. } => {
                run_control(&node.op, &args).map_err(|e| e.at(node.location))?.into_iter().collect()
            }
            Op::Kernel { .. } => {
                // Declared output types may hold unknown dims, so only the
                // inputs are checked here; the outputs are checked below.
                let types: SmallVec<[TensorType; 2]> = args.iter().map(concrete_type).collect();
                infer(&node.op, &types, Some(graph)).map_err(|e| e.at(node.location))?;
                let refs: SmallVec<[&Storage; 2]> = args.iter().collect();
                eval_primitive(&node.op, &refs).into_iter().collect()
            }
            Op::ReadVariable { var, .. } => {
                let v = graph.variables.get(*var).ok_or_else(|| broken(format!("unknown variable {var}")))?;
                smallvec::smallvec![v.read()]
            }
            Op::AssignVariable { var, kind, .. } => {
                check_concrete(graph, &node.op, &args, &node.outputs)
                    .map_err(|e| e.into_ir(&broken).at(node.location))?;
                let v = graph.variables.get(*var).ok_or_else(|| broken(format!("unknown variable {var}")))?;
                match kind {
                    AssignKind::Assign => v.write(args[0].clone()),
                    AssignKind::Add => v.update(&mut |cur| kernels::binary(BinaryOp::Add, cur, &args[0])),
                    AssignKind::Sub => v.update(&mut |cur| kernels::binary(BinaryOp::Sub, cur, &args[0])),
                }
                SmallVec::new()
            }
            // The primitives: a reference kernel each.
            op @ (Op::Constant { .. } | primitive_ops!()) => {
                let (types, outputs) = check_concrete(graph, op, &args, &node.outputs)
                    .map_err(|e| e.into_ir(&broken).at(node.location))?;
                crate::check_outputs_allocatable(op, &types, &outputs).map_err(|e| e.at(node.location))?;
                let refs: SmallVec<[&Storage; 2]> = args.iter().collect();
                eval_primitive(op, &refs).into_iter().collect()
            }
        };
        if outs.len() != node.outputs.len() {
            return Err(broken(format!("produced {} values for {} declared outputs", outs.len(), node.outputs.len())));
        }
        for (i, (x, ty)) in outs.iter().zip(&node.outputs).enumerate() {
            if !ty.accepts(x.dtype(), x.shape()) {
                return Err(broken(format!(
                    "output {i} is {} at run time, which does not fit its declared type {ty}",
                    concrete_type(x)
                )));
            }
        }

        drop(args);
        values[id.index()] = Some(outs);
        for v in node.inputs.iter().map(|v| v.node.index()).chain([id.index()]) {
            if last_use[v] == id.index() {
                values[v] = None;
            }
        }
    }

    graph
        .outputs
        .iter()
        .map(|v| {
            values
                .get(v.node.index())
                .and_then(|outs| outs.as_ref())
                .and_then(|outs| outs.get(v.index as usize))
                .cloned()
                .ok_or_else(|| IrError::Verifier {
                    graph: graph.name.clone(),
                    node: v.node,
                    message: format!("graph output {v} does not exist"),
                })
        })
        .collect()
}

/// Runs a `cond` or `while` node on concrete operands, interpreting the
/// subgraphs.
fn run_control(op: &Op, args: &[Storage]) -> Result<Vec<Storage>, IrError> {
    let subgraphs = op.subgraphs();
    let mut run = crate::control::RunWith(|k: usize, xs: &[Storage]| interpret(&subgraphs[k], xs));
    match op {
        Op::Cond { .. } => crate::control::run_cond(args, &mut run),
        Op::While { parts, cancel, .. } => {
            crate::control::run_while(parts[1].outputs.len(), args, &mut run, cancel.as_ref())
        }
        Op::Parameter { .. }
        | Op::Constant { .. }
        | primitive_ops!()
        | Op::Call { .. }
        | Op::Fused { .. }
        | Op::Kernel { .. }
        | Op::ReadVariable { .. }
        | Op::AssignVariable { .. } => unreachable!("run_control runs control flow only"),
    }
}

/// The exact type of a concrete value.
fn concrete_type(x: &Storage) -> TensorType {
    TensorType::known(x.dtype(), x.shape())
}

/// Why a node cannot run on its concrete operands.
enum Mismatch {
    /// The op rejects the operands (a user error caught at run time).
    Op(crate::OpError),
    /// The operands fit, but the result would not fit the declared type.
    Declared(String),
}

impl Mismatch {
    fn into_ir(self, broken: &impl Fn(String) -> IrError) -> IrError {
        match self {
            Mismatch::Op(e) => IrError::Op(e),
            Mismatch::Declared(m) => broken(m),
        }
    }
}

/// Concrete input and output types of one node.
type ConcreteTypes = (SmallVec<[TensorType; 2]>, SmallVec<[TensorType; 1]>);

/// Re-runs inference on the concrete operand types and checks the result
/// against the declared output types; returns the concrete input and
/// output types.
fn check_concrete(
    graph: &Graph,
    op: &Op,
    args: &[Storage],
    declared: &[TensorType],
) -> Result<ConcreteTypes, Mismatch> {
    let types: SmallVec<[TensorType; 2]> = args.iter().map(concrete_type).collect();
    let got = infer(op, &types, Some(graph)).map_err(Mismatch::Op)?;
    if got.len() != declared.len() {
        return Err(Mismatch::Declared(format!("inference gives {} outputs, {} declared", got.len(), declared.len())));
    }
    for (i, (g, d)) in got.iter().zip(declared).enumerate() {
        let fits = g.shape().is_some_and(|s| d.accepts(g.dtype, &s));
        if !fits {
            return Err(Mismatch::Declared(format!(
                "output {i} would be {g} at run time, which does not fit its declared type {d}"
            )));
        }
    }
    Ok((types, got))
}

/// Runs an [`Op::Kernel`] node's native code on `inputs` with the vector
/// code `isa` allows, checking its results against the node's declared
/// output types: a kernel that breaks its declaration is a bug in that
/// kernel, reported by name (a panic, as any op's misuse).
///
/// # Panics
/// If `op` is not a kernel, or the kernel breaks its declaration.
pub fn eval_kernel(op: &Op, inputs: &[&Storage], isa: tracejit_kernels::Isa) -> Vec<Storage> {
    let Op::Kernel { name, kernel, outputs, .. } = op else {
        panic!("eval_kernel: `{}` is not a kernel", op.name());
    };
    let owned: Vec<Storage> = inputs.iter().map(|s| (*s).clone()).collect();
    let outs = kernel.run(&owned, isa);
    assert_eq!(outs.len(), outputs.len(), "kernel `{name}` returned {} values, expected {}", outs.len(), outputs.len());
    for (i, (x, ty)) in outs.iter().zip(outputs).enumerate() {
        assert!(
            ty.accepts(x.dtype(), x.shape()),
            "kernel `{name}`: output {i} is {}, which does not fit its declared type {ty}",
            concrete_type(x)
        );
    }
    outs
}
