//! The `Op` enum: every operation a graph node can perform, with its
//! attributes. It is closed on purpose: adding a variant is a compile error in
//! shape inference, the interpreter, the printer and (later) the JIT and the
//! gradient rules until each handles it.

use std::sync::Arc;

use tracejit_tensor::{ArgReduceOp, BinaryOp, DType, RandomDist, ReduceOp, SliceSpec, SpatialOp, Storage, UnaryOp};

pub use crate::external::ExternalKernel;
use crate::graph::{FuncId, VarId};
use crate::{Effects, TensorType};

/// The pattern of the primitive compute ops: stateless, holding no code,
/// each computed by a reference kernel (`eval_primitive`). Matches that
/// treat these ops alike use it, so the list is written once; an op that
/// joins the `Op` enum is either added here (and handled wherever
/// primitives are, through their own exhaustive matches such as inference
/// and the reference kernels) or is a compile error in every match over
/// `Op`.
#[macro_export]
macro_rules! primitive_ops {
    () => {
        $crate::Op::Unary(_)
            | $crate::Op::Binary(_)
            | $crate::Op::Select
            | $crate::Op::Cast { .. }
            | $crate::Op::Clamp { .. }
            | $crate::Op::Reduce { .. }
            | $crate::Op::ArgReduce { .. }
            | $crate::Op::MatMul
            | $crate::Op::Reshape { .. }
            | $crate::Op::Transpose { .. }
            | $crate::Op::BroadcastTo { .. }
            | $crate::Op::ExpandDims { .. }
            | $crate::Op::Squeeze { .. }
            | $crate::Op::Concat { .. }
            | $crate::Op::Stack { .. }
            | $crate::Op::Slice { .. }
            | $crate::Op::Gather { .. }
            | $crate::Op::OneHot { .. }
            | $crate::Op::GatherElements { .. }
            | $crate::Op::ScatterAdd { .. }
            | $crate::Op::DynamicSlice { .. }
            | $crate::Op::DynamicUpdateSlice
            | $crate::Op::Pad { .. }
            | $crate::Op::Cumsum { .. }
            | $crate::Op::TopK { .. }
            | $crate::Op::Random { .. }
            | $crate::Op::Spatial(_)
    };
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
    /// Every variant, for tables and parsers.
    pub const ALL: [AssignKind; 3] = [AssignKind::Assign, AssignKind::Add, AssignKind::Sub];

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
    /// Reads `x` at `indices` along `axis` (ONNX GatherElements, numpy's
    /// `take_along_axis`); inputs (x, indices), the result of the indices'
    /// shape.
    GatherElements {
        /// The axis.
        axis: usize,
    },
    /// Adds `updates` into `x` at `indices` along `axis` (ONNX
    /// ScatterElements with `reduction="add"`); inputs (x, indices,
    /// updates), the indices broadcasting against the updates.
    ScatterAdd {
        /// The axis.
        axis: usize,
    },
    /// A window of `sizes` of `x` at `starts`, each start clamped into
    /// `[0, dim - size]` (XLA's DynamicSlice); inputs (x, starts: an
    /// integer vector of one start per axis).
    DynamicSlice {
        /// The window's size on each axis.
        sizes: Vec<usize>,
    },
    /// `x` with the window at `starts` (clamped as `DynamicSlice`'s)
    /// replaced by `update`; inputs (x, update, starts).
    DynamicUpdateSlice,
    /// `x` with a constant border: `pads[i] = (before, after)` on axis `i`.
    Pad {
        /// Elements added before and after, per axis.
        pads: Vec<(usize, usize)>,
        /// The border's value (converted to the dtype).
        value: f64,
    },
    /// Inclusive prefix sums along `axis`.
    Cumsum {
        /// The axis.
        axis: usize,
    },
    /// The `k` largest entries along the last axis, largest first (NaN
    /// above every number, ties by index); outputs (values, i64 indices).
    TopK {
        /// How many.
        k: usize,
    },
    /// A random draw from the Philox stream of its first input (an i64
    /// `[counter_lo, counter_hi, key]` state, or an i64 `[2]` seed): element
    /// `i` is a function of the state and `i` only. With `shape` `None` the
    /// draw takes the shape of a second input (whose values it ignores).
    /// Its effect is [`Effects::RANDOM`]: passes never fold, merge or move
    /// it.
    Random {
        /// The distribution.
        dist: RandomDist,
        /// The output dtype (f32 or f64).
        dtype: DType,
        /// The output shape, or `None` for the second input's.
        shape: Option<Vec<usize>>,
    },
    /// A 2-D convolution or pooling over NCHW tensors, or one of their
    /// gradients (ONNX `Conv` / `MaxPool` / `AveragePool` semantics); the
    /// table on [`SpatialOp`] lists each one's inputs and outputs. The JIT
    /// runs them through the direct kernels of `tracejit_kernels::conv`
    /// and `pool2d`, the interpreter through the reference loops.
    Spatial(SpatialOp),
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
    /// A conditional: inputs `(pred, operands...)`, `pred` a bool scalar.
    /// `branches[0]` (then) runs when `pred` is true, `branches[1]` (else)
    /// otherwise; each takes the operands as its parameters and returns one
    /// value per output. Only the taken branch runs, so its effects happen
    /// only then.
    Cond {
        /// The then and else graphs.
        branches: [Arc<crate::Graph>; 2],
    },
    /// A loop: inputs `(carried..., captured...)`. `parts[0]`, the
    /// condition, maps `(carried..., captured...)` to a bool scalar;
    /// `parts[1]`, the body, maps them to the next carried values (of the
    /// same types). The outputs are the carried values once the condition
    /// is false; zero iterations return the initial values.
    While {
        /// The condition and the body.
        parts: [Arc<crate::Graph>; 2],
        /// The number of iterations when it is known statically
        /// (`fori_loop`); reverse mode needs it.
        trip_count: Option<usize>,
        /// Checked before every trip: a cancelled token (or one past its
        /// deadline) stops the loop with an error (`while_loop_with`'s
        /// `cancel`). Printed `cancel`; a parsed graph gets a new token.
        cancel: Option<crate::control::CancelToken>,
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
        /// Part of an update that holds the variable's update lock (TF's
        /// `use_locking`): executors take it before the first locked access
        /// of a run and release it after the last (see [`crate::locks`]).
        /// Printed `locked`.
        locked: bool,
    },
    /// Writes a variable (stateful); one input, the value; no outputs.
    AssignVariable {
        /// The variable.
        var: VarId,
        /// Assign, add or subtract.
        kind: AssignKind,
        /// Part of a locked update, as [`Op::ReadVariable`]'s.
        locked: bool,
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
            Op::GatherElements { .. } => "gather_elements",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::DynamicSlice { .. } => "dynamic_slice",
            Op::DynamicUpdateSlice => "dynamic_update_slice",
            Op::Pad { .. } => "pad",
            Op::Cumsum { .. } => "cumsum",
            Op::TopK { .. } => "top_k",
            Op::Random { dist, .. } => dist.name(),
            Op::Spatial(sp) => sp.name(),
            Op::Call { .. } => "call",
            Op::Fused { .. } => "fused",
            Op::Cond { .. } => "cond",
            Op::While { .. } => "while",
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
            | Op::Pad { .. }
            | Op::Cumsum { .. }
            | Op::TopK { .. }
            | Op::AssignVariable { .. } => Some(1),
            Op::Binary(_) | Op::MatMul | Op::Gather { .. } | Op::GatherElements { .. } | Op::DynamicSlice { .. } => {
                Some(2)
            }
            Op::Select | Op::ScatterAdd { .. } | Op::DynamicUpdateSlice => Some(3),
            Op::Random { shape, .. } => Some(if shape.is_some() { 1 } else { 2 }),
            Op::Spatial(sp) => Some(sp.num_inputs()),
            Op::Concat { .. } | Op::Stack { .. } | Op::Call { .. } => None,
            Op::Fused { body } => Some(body.params.len()),
            Op::Cond { branches } => Some(1 + branches[0].params.len()),
            Op::While { parts, .. } => Some(parts[1].params.len()),
            Op::Kernel { inputs, .. } => Some(inputs.len()),
        }
    }

    /// How many outputs the op produces, or `None` for `call` (the callee's
    /// output count).
    pub fn num_outputs(&self) -> Option<usize> {
        match self {
            Op::AssignVariable { .. } => Some(0),
            Op::TopK { .. } => Some(2),
            Op::Spatial(sp) => Some(sp.num_outputs()),
            Op::Call { .. } => None,
            Op::Fused { body } => Some(body.outputs.len()),
            Op::Cond { branches } => Some(branches[0].outputs.len()),
            Op::While { parts, .. } => Some(parts[1].outputs.len()),
            Op::Kernel { outputs, .. } => Some(outputs.len()),
            Op::Parameter { .. }
            | Op::Constant { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast { .. }
            | Op::Clamp { .. }
            | Op::Reduce { .. }
            | Op::ArgReduce { .. }
            | Op::MatMul
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::BroadcastTo { .. }
            | Op::ExpandDims { .. }
            | Op::Squeeze { .. }
            | Op::Concat { .. }
            | Op::Stack { .. }
            | Op::Slice { .. }
            | Op::Gather { .. }
            | Op::OneHot { .. }
            | Op::GatherElements { .. }
            | Op::ScatterAdd { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Pad { .. }
            | Op::Cumsum { .. }
            | Op::Random { .. }
            | Op::ReadVariable { .. } => Some(1),
        }
    }

    /// The graphs this op holds and runs (a fused region's body, the
    /// branches of a conditional, the condition and body of a loop), tract's
    /// `nested_models`. Passes, the verifier, the printer and the executors
    /// reach nested code only through this, so a new op with subgraphs is a
    /// variant plus its semantics, not a special case in each of them. A
    /// `call` is not listed: its callee lives in the library.
    pub fn subgraphs(&self) -> &[Arc<crate::Graph>] {
        match self {
            Op::Fused { body } => std::slice::from_ref(body),
            Op::Cond { branches } => branches,
            Op::While { parts, .. } => parts,
            Op::Parameter { .. }
            | Op::Constant { .. }
            | primitive_ops!()
            | Op::Call { .. }
            | Op::Kernel { .. }
            | Op::ReadVariable { .. }
            | Op::AssignVariable { .. } => &[],
        }
    }

    /// The subgraphs, to rewrite in place (`Arc::make_mut` copies a body
    /// another node shares).
    pub fn subgraphs_mut(&mut self) -> &mut [Arc<crate::Graph>] {
        match self {
            Op::Fused { body } => std::slice::from_mut(body),
            Op::Cond { branches } => branches,
            Op::While { parts, .. } => parts,
            Op::Parameter { .. }
            | Op::Constant { .. }
            | primitive_ops!()
            | Op::Call { .. }
            | Op::Kernel { .. }
            | Op::ReadVariable { .. }
            | Op::AssignVariable { .. } => &mut [],
        }
    }

    /// What running the op does besides computing its outputs. An op with
    /// subgraphs has the effects of everything in them, and a `call` those of
    /// its callee in `library` (an unknown callee counts as writing, so that
    /// nothing is dropped on a guess). Passes never fold, merge, reorder or
    /// drop an op whose effects are not [`Effects::PURE`].
    pub fn effects(&self, library: &crate::FunctionLibrary) -> Effects {
        match self {
            // A draw's values are a function of its state input, but two
            // draws must never be merged, folded or moved: its own effect.
            Op::Random { .. } => Effects::RANDOM,
            Op::Parameter { .. }
            | Op::Constant { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast { .. }
            | Op::Clamp { .. }
            | Op::Reduce { .. }
            | Op::ArgReduce { .. }
            | Op::MatMul
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::BroadcastTo { .. }
            | Op::ExpandDims { .. }
            | Op::Squeeze { .. }
            | Op::Concat { .. }
            | Op::Stack { .. }
            | Op::Slice { .. }
            | Op::Gather { .. }
            | Op::OneHot { .. }
            | Op::GatherElements { .. }
            | Op::ScatterAdd { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Pad { .. }
            | Op::Cumsum { .. }
            | Op::TopK { .. }
            | Op::Spatial(_) => Effects::PURE,
            // A composite's kernel is a pure function of its inputs; a
            // debug callback says it writes.
            Op::Kernel { kernel, .. } => kernel.effects(),
            Op::ReadVariable { .. } => Effects::READS,
            Op::AssignVariable { .. } => Effects::WRITES,
            Op::Call { func } => match library.try_get(*func) {
                Some(f) => f.graph.effects(),
                None => Effects::WRITES,
            },
            Op::Fused { .. } | Op::Cond { .. } | Op::While { .. } => {
                self.subgraphs().iter().fold(Effects::PURE, |e, g| e.union(g.effects()))
            }
        }
    }

    /// The op's class: the one table of which kind of op each variant is.
    /// Passes that ask one fact of every op (is it stateful? a source? does
    /// it hold code?) ask it here instead of listing the variants again;
    /// matches that do something different per op stay exhaustive.
    pub fn class(&self) -> OpClass {
        match self {
            Op::Parameter { .. } | Op::Constant { .. } => OpClass::Source,
            Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } | Op::Clamp { .. } => OpClass::Elementwise,
            Op::BroadcastTo { .. } | Op::ExpandDims { .. } => OpClass::Broadcast,
            Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Squeeze { .. }
            | Op::Concat { .. }
            | Op::Stack { .. }
            | Op::Slice { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Pad { .. } => OpClass::Layout,
            Op::Reduce { .. } | Op::ArgReduce { .. } => OpClass::Reduction,
            Op::MatMul => OpClass::Contraction,
            Op::Spatial(_) => OpClass::Spatial,
            Op::Gather { .. } | Op::OneHot { .. } | Op::GatherElements { .. } | Op::ScatterAdd { .. } => {
                OpClass::Indexing
            }
            Op::Cumsum { .. } | Op::TopK { .. } => OpClass::Scan,
            Op::Random { .. } => OpClass::Random,
            Op::Fused { .. } => OpClass::Region,
            Op::Cond { .. } | Op::While { .. } => OpClass::Control,
            Op::Call { .. } => OpClass::Call,
            Op::Kernel { .. } => OpClass::Kernel,
            Op::ReadVariable { .. } | Op::AssignVariable { .. } => OpClass::State,
        }
    }

    /// True for ops that read or write a variable ([`OpClass::State`]).
    pub fn is_stateful(&self) -> bool {
        self.class() == OpClass::State
    }

    /// True for parameters and constants ([`OpClass::Source`]): nodes that
    /// compute nothing.
    pub fn is_source(&self) -> bool {
        self.class() == OpClass::Source
    }

    /// True for elementwise ops (the fusion planner's basic material).
    pub fn is_elementwise(&self) -> bool {
        self.class() == OpClass::Elementwise
    }

    /// True for ops that may join a fused region: elementwise ops, the
    /// broadcasts that feed them, `one_hot` (elementwise over its output:
    /// `labels[i] == j`), and reductions. The fusion pass and the JIT
    /// executor's own grouping share this one rule; the region acceptor
    /// still decides (the default rule takes no `one_hot`).
    pub fn is_fusible(&self) -> bool {
        match self.class() {
            OpClass::Elementwise | OpClass::Broadcast => true,
            OpClass::Reduction => matches!(self, Op::Reduce { .. }),
            OpClass::Indexing => matches!(self, Op::OneHot { .. }),
            OpClass::Source
            | OpClass::Layout
            | OpClass::Scan
            | OpClass::Random
            | OpClass::Contraction
            | OpClass::Spatial
            | OpClass::Region
            | OpClass::Control
            | OpClass::Call
            | OpClass::Kernel
            | OpClass::State => false,
        }
    }

    /// True when the op's per-element cost makes recomputing it unacceptable
    /// (the fusion planner never duplicates such a producer). Only
    /// elementwise ops are ever recomputed, so only they can be expensive.
    pub fn is_expensive(&self) -> bool {
        // Only elementwise ops are ever recomputed; the class says which
        // those are, and their op tables say which are expensive.
        if let Op::Unary(u) = self {
            return u.is_expensive();
        }
        if let Op::Binary(b) = self {
            return b.is_expensive();
        }
        false
    }
}

/// Which kind of op a node is ([`Op::class`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// A graph input or a constant: computes nothing.
    Source,
    /// Elementwise over its (broadcast) operands: unary, binary, select,
    /// cast, clamp.
    Elementwise,
    /// Adds size-1 or broadcast axes: `broadcast_to`, `expand_dims`.
    Broadcast,
    /// Moves or regroups elements: reshape, transpose, squeeze, concat,
    /// stack, slice, dynamic slices, pad.
    Layout,
    /// Reduces axes: reductions and arg-reductions.
    Reduction,
    /// Scans along an axis: cumulative sums, top-k.
    Scan,
    /// Draws random numbers from a state input.
    Random,
    /// A matrix product.
    Contraction,
    /// A 2-D convolution or pooling, or one of their gradients.
    Spatial,
    /// Reads or writes entries by index: gather, one_hot, gather_elements,
    /// scatter_add.
    Indexing,
    /// A fused region (holds its body).
    Region,
    /// `cond` and `while` (hold their subgraphs).
    Control,
    /// A call of a library function.
    Call,
    /// A registered native kernel.
    Kernel,
    /// Reads or writes a variable.
    State,
}
