//! The `Op` enum: every operation a graph node can perform, with its
//! attributes. It is closed on purpose: adding a variant is a compile error in
//! shape inference, the interpreter, the printer and (later) the JIT and the
//! gradient rules until each handles it.

use std::fmt;
use std::sync::Arc;

use tracejit_tensor::{ArgReduceOp, BinaryOp, DType, ReduceOp, SliceSpec, Storage, UnaryOp};

use crate::graph::{FuncId, VarId};
use crate::TensorType;

/// Native code standing in for a composite function: the implementation
/// selector replaces a `Call` of a function marked `implements = name` by an
/// [`Op::Kernel`] node holding one of these when a kernel is registered for
/// `name` in [`crate::registry`] (which `tracejit::composite` fills).
///
/// A kernel must be a pure function of its inputs (passes may merge two
/// identical kernel nodes, or drop one whose results are unused) and return
/// one value per declared output, of the declared dtype and a shape the
/// declared type accepts; `eval_primitive` checks that and panics naming the
/// kernel otherwise.
pub trait ExternalKernel: Send + Sync + fmt::Debug {
    /// Runs the kernel on concrete inputs.
    fn run(&self, inputs: &[Storage]) -> Vec<Storage>;
}

/// How an `AssignVariable` node combines the new value with the old.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AssignKind {
    /// `v = x`
    Assign,
    /// `v = v + x`
    Add,
    /// `v = v - x`
    Sub,
}

impl AssignKind {
    /// `assign`, `assign_add` or `assign_sub`.
    pub fn name(self) -> &'static str {
        match self {
            AssignKind::Assign => "assign",
            AssignKind::Add => "assign_add",
            AssignKind::Sub => "assign_sub",
        }
    }
}

/// The operation of a node. Inputs are listed on the node; the comment on each
/// variant says what they are.
#[derive(Clone, Debug)]
pub enum Op {
    /// The `index`-th flat input of the graph. No inputs.
    Parameter {
        /// Position among the graph's inputs.
        index: usize,
    },
    /// A literal or a captured eager tensor. No inputs.
    Constant {
        /// The value.
        value: Storage,
    },
    /// Elementwise op of one input.
    Unary(UnaryOp),
    /// Elementwise op of two inputs with broadcasting.
    Binary(BinaryOp),
    /// `cond ? a : b`; inputs (cond, a, b), broadcast.
    Select,
    /// Converts the input to `to`.
    Cast {
        /// Target dtype.
        to: DType,
    },
    /// Clamps the input into `[min, max]`.
    Clamp {
        /// Lower bound (converted to the input dtype).
        min: f64,
        /// Upper bound (converted to the input dtype).
        max: f64,
    },
    /// Reduction over `axes` (sorted, unique, non-negative).
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// Reduced axes.
        axes: Vec<usize>,
        /// Keep reduced axes as size 1.
        keepdims: bool,
    },
    /// argmax / argmin along one axis; i64 result.
    ArgReduce {
        /// Which one.
        op: ArgReduceOp,
        /// The axis.
        axis: usize,
        /// Keep the axis as size 1.
        keepdims: bool,
    },
    /// Matrix product of the last two axes; inputs (a, b).
    MatMul,
    /// New shape; at most one `-1`, resolved from the element count.
    Reshape {
        /// Target shape.
        shape: Vec<i64>,
    },
    /// Permutes axes.
    Transpose {
        /// `out.dims[i] = in.dims[perm[i]]`.
        perm: Vec<usize>,
    },
    /// Broadcasts to a shape (numpy rules).
    BroadcastTo {
        /// Target shape.
        shape: Vec<usize>,
    },
    /// Inserts a size-1 axis at `axis` (of the output).
    ExpandDims {
        /// Position in the output.
        axis: usize,
    },
    /// Removes size-1 axes.
    Squeeze {
        /// Axes to remove (sorted, unique).
        axes: Vec<usize>,
    },
    /// Joins the inputs along an existing axis.
    Concat {
        /// The axis.
        axis: usize,
    },
    /// Joins the inputs along a new axis.
    Stack {
        /// Position of the new axis in the output.
        axis: usize,
    },
    /// numpy basic slicing, one spec per axis.
    Slice {
        /// Per-axis start/stop/step.
        specs: Vec<SliceSpec>,
    },
    /// Picks entries along `axis`; inputs (params, indices).
    Gather {
        /// The axis of params.
        axis: usize,
    },
    /// One-hot encoding along a new last axis.
    OneHot {
        /// Size of the new axis.
        depth: usize,
        /// Output dtype.
        dtype: DType,
    },
    /// Calls a function of the graph's library; inputs are its arguments,
    /// outputs its results.
    Call {
        /// The callee.
        func: FuncId,
    },
    /// A fused region: `body` is a graph of elementwise ops (and reductions
    /// ending in them) whose params are this node's inputs and whose outputs
    /// are this node's outputs. The fusion pass creates it; the JIT compiles
    /// `body` into one kernel; the interpreter runs `body`.
    Fused {
        /// The region's computation.
        body: std::sync::Arc<crate::Graph>,
    },
    /// A registered native kernel replacing a composite `Call` (created by the
    /// implementation selector). Inputs are the call's arguments; `inputs`
    /// and `outputs` are the types it was selected for (the kernel itself
    /// has no type rule, so they are stored).
    Kernel {
        /// The composite op's name (`org.semantic.opname`).
        name: String,
        /// The code.
        kernel: Arc<dyn ExternalKernel>,
        /// The accepted type of each input.
        inputs: Vec<TensorType>,
        /// The type of each output.
        outputs: Vec<TensorType>,
    },
    /// Reads a variable (stateful). No data inputs.
    ReadVariable {
        /// The variable.
        var: VarId,
    },
    /// Writes a variable (stateful); one input, the value; no outputs.
    AssignVariable {
        /// The variable.
        var: VarId,
        /// Assign, add or subtract.
        kind: AssignKind,
    },
}

impl Op {
    /// The op's name as printed in listings and error messages (`add`,
    /// `reduce_sum`, `matmul`).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Parameter { .. } => "parameter",
            Op::Constant { .. } => "constant",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Select => "select",
            Op::Cast { .. } => "cast",
            Op::Clamp { .. } => "clamp",
            Op::Reduce { op, .. } => op.name(),
            Op::ArgReduce { op, .. } => op.name(),
            Op::MatMul => "matmul",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::BroadcastTo { .. } => "broadcast_to",
            Op::ExpandDims { .. } => "expand_dims",
            Op::Squeeze { .. } => "squeeze",
            Op::Concat { .. } => "concat",
            Op::Stack { .. } => "stack",
            Op::Slice { .. } => "slice",
            Op::Gather { .. } => "gather",
            Op::OneHot { .. } => "one_hot",
            Op::Call { .. } => "call",
            Op::Fused { .. } => "fused",
            Op::Kernel { .. } => "kernel",
            Op::ReadVariable { .. } => "read_variable",
            Op::AssignVariable { .. } => "assign_variable",
        }
    }

    /// How many data inputs the op takes, or `None` when it varies (`concat`,
    /// `stack`: at least one; `call`: the callee's parameter count).
    pub fn num_inputs(&self) -> Option<usize> {
        match self {
            Op::Parameter { .. } | Op::Constant { .. } | Op::ReadVariable { .. } => Some(0),
            Op::Unary(_)
            | Op::Cast { .. }
            | Op::Clamp { .. }
            | Op::Reduce { .. }
            | Op::ArgReduce { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::BroadcastTo { .. }
            | Op::ExpandDims { .. }
            | Op::Squeeze { .. }
            | Op::Slice { .. }
            | Op::OneHot { .. }
            | Op::AssignVariable { .. } => Some(1),
            Op::Binary(_) | Op::MatMul | Op::Gather { .. } => Some(2),
            Op::Select => Some(3),
            Op::Concat { .. } | Op::Stack { .. } | Op::Call { .. } => None,
            Op::Fused { body } => Some(body.params.len()),
            Op::Kernel { inputs, .. } => Some(inputs.len()),
        }
    }

    /// How many outputs the op produces, or `None` for `call` (the callee's
    /// output count).
    pub fn num_outputs(&self) -> Option<usize> {
        match self {
            Op::AssignVariable { .. } => Some(0),
            Op::Call { .. } => None,
            Op::Fused { body } => Some(body.outputs.len()),
            Op::Kernel { outputs, .. } => Some(outputs.len()),
            _ => Some(1),
        }
    }

    /// True for ops with side effects or hidden state: passes never fold,
    /// merge, reorder or drop them.
    pub fn is_stateful(&self) -> bool {
        matches!(self, Op::ReadVariable { .. } | Op::AssignVariable { .. })
    }

    /// True for elementwise ops (the fusion planner's basic material).
    pub fn is_elementwise(&self) -> bool {
        matches!(self, Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } | Op::Clamp { .. })
    }

    /// True for ops that may join a fused region: elementwise ops, the
    /// broadcasts that feed them, and reductions. The fusion pass and the
    /// JIT executor's own grouping share this one rule.
    pub fn is_fusible(&self) -> bool {
        self.is_elementwise() || matches!(self, Op::Reduce { .. } | Op::BroadcastTo { .. } | Op::ExpandDims { .. })
    }
}
