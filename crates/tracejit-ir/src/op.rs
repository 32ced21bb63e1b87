//! The `Op` enum: every operation a graph node can perform, with its
//! attributes. It is closed on purpose: adding a variant is a compile error in
//! shape inference, the interpreter, the printer and (later) the JIT and the
//! gradient rules until each handles it.

use std::sync::Arc;

use tracejit_tensor::{ArgReduceOp, BinaryOp, DType, RandomDist, ReduceOp, SliceSpec, SpatialOp, Storage, UnaryOp};

pub use crate::external::ExternalKernel;
use crate::graph::{FuncId, VarId};
use crate::op_table::define_ops;
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

define_ops! {
    /// The operation of a node. Inputs are listed on the node; the comment on each
    /// variant says what they are. Generated from this table (see `op_table`).
    #[derive(Clone, Debug)]
    pub enum Op {
        /// The `index`-th flat input of the graph. No inputs.
        Parameter {
            /// Position among the graph's inputs.
            index: usize,
        } => tag 0, name "parameter", class Source, inputs Some(0), outputs Some(1),
            effects |_library| Effects::PURE;
        /// A literal or a captured eager tensor. No inputs.
        Constant {
            /// The value.
            value: Storage,
        } => tag 1, name "constant", class Source, inputs Some(0), outputs Some(1),
            effects |_library| Effects::PURE;
        /// Elementwise op of one input.
        Unary(u: UnaryOp) => tag 2, name u.name(), class Elementwise, inputs Some(1), outputs Some(1),
            effects |_library| Effects::PURE;
        /// Elementwise op of two inputs with broadcasting.
        Binary(b: BinaryOp) => tag 3, name b.name(), class Elementwise, inputs Some(2), outputs Some(1),
            effects |_library| Effects::PURE;
        /// `cond ? a : b`; inputs (cond, a, b), broadcast.
        Select => tag 4, name "select", class Elementwise, inputs Some(3), outputs Some(1),
            effects |_library| Effects::PURE;
        /// Converts the input to `to`.
        Cast {
            /// Target dtype.
            to: DType,
        } => tag 5, name "cast", class Elementwise, inputs Some(1), outputs Some(1),
            effects |_library| Effects::PURE;
        /// Clamps the input into `[min, max]`.
        Clamp {
            /// Lower bound (converted to the input dtype).
            min: f64,
            /// Upper bound (converted to the input dtype).
            max: f64,
        } => tag 6, name "clamp", class Elementwise, inputs Some(1), outputs Some(1),
            effects |_library| Effects::PURE;
        /// Reduction over `axes` (sorted, unique, non-negative).
        Reduce {
            /// Which reduction.
            op: ReduceOp,
            /// Reduced axes.
            axes: Vec<usize>,
            /// Keep reduced axes as size 1.
            keepdims: bool,
        } => tag 7, name op.name(), class Reduction, inputs Some(1), outputs Some(1),
            effects |_library| Effects::PURE;
        /// argmax / argmin along one axis; i64 result.
        ArgReduce {
            /// Which one.
            op: ArgReduceOp,
            /// The axis.
            axis: usize,
            /// Keep the axis as size 1.
            keepdims: bool,
        } => tag 8, name op.name(), class Reduction, inputs Some(1), outputs Some(1),
            effects |_library| Effects::PURE;
        /// Matrix product of the last two axes; inputs (a, b).
        MatMul => tag 9, name "matmul", class Contraction, inputs Some(2), outputs Some(1),
            effects |_library| Effects::PURE;
        /// New shape; at most one `-1`, resolved from the element count.
        Reshape {
            /// Target shape.
            shape: Vec<i64>,
        } => tag 10, name "reshape", class Layout, inputs Some(1), outputs Some(1),
            effects |_library| Effects::PURE;
        /// Permutes axes.
        Transpose {
            /// `out.dims[i] = in.dims[perm[i]]`.
            perm: Vec<usize>,
        } => tag 11, name "transpose", class Layout, inputs Some(1), outputs Some(1),
            effects |_library| Effects::PURE;
        /// Broadcasts to a shape (numpy rules).
        BroadcastTo {
            /// Target shape.
            shape: Vec<usize>,
        } => tag 12, name "broadcast_to", class Broadcast, inputs Some(1), outputs Some(1),
            effects |_library| Effects::PURE;
        /// Inserts a size-1 axis at `axis` (of the output).
        ExpandDims {
            /// Position in the output.
            axis: usize,
        } => tag 13, name "expand_dims", class Broadcast, inputs Some(1), outputs Some(1),
            effects |_library| Effects::PURE;
        /// Removes size-1 axes.
        Squeeze {
            /// Axes to remove (sorted, unique).
            axes: Vec<usize>,
        } => tag 14, name "squeeze", class Layout, inputs Some(1), outputs Some(1),
            effects |_library| Effects::PURE;
        /// Joins the inputs along an existing axis.
        Concat {
            /// The axis.
            axis: usize,
        } => tag 15, name "concat", class Layout, inputs None, outputs Some(1),
            effects |_library| Effects::PURE;
        /// Joins the inputs along a new axis.
        Stack {
            /// Position of the new axis in the output.
            axis: usize,
        } => tag 16, name "stack", class Layout, inputs None, outputs Some(1),
            effects |_library| Effects::PURE;
        /// numpy basic slicing, one spec per axis.
        Slice {
            /// Per-axis start/stop/step.
            specs: Vec<SliceSpec>,
        } => tag 17, name "slice", class Layout, inputs Some(1), outputs Some(1),
            effects |_library| Effects::PURE;
        /// Picks entries along `axis`; inputs (params, indices).
        Gather {
            /// The axis of params.
            axis: usize,
        } => tag 18, name "gather", class Indexing, inputs Some(2), outputs Some(1),
            effects |_library| Effects::PURE;
        /// One-hot encoding along a new last axis.
        OneHot {
            /// Size of the new axis.
            depth: usize,
            /// Output dtype.
            dtype: DType,
        } => tag 19, name "one_hot", class Indexing, inputs Some(1), outputs Some(1),
            effects |_library| Effects::PURE;
        /// Reads `x` at `indices` along `axis` (ONNX GatherElements, numpy's
        /// `take_along_axis`); inputs (x, indices), the result of the indices'
        /// shape.
        GatherElements {
            /// The axis.
            axis: usize,
        } => tag 27, name "gather_elements", class Indexing, inputs Some(2), outputs Some(1),
            effects |_library| Effects::PURE;
        /// Adds `updates` into `x` at `indices` along `axis` (ONNX
        /// ScatterElements with `reduction="add"`); inputs (x, indices,
        /// updates), the indices broadcasting against the updates.
        ScatterAdd {
            /// The axis.
            axis: usize,
        } => tag 28, name "scatter_add", class Indexing, inputs Some(3), outputs Some(1),
            effects |_library| Effects::PURE;
        /// A window of `sizes` of `x` at `starts`, each start clamped into
        /// `[0, dim - size]` (XLA's DynamicSlice); inputs (x, starts: an
        /// integer vector of one start per axis).
        DynamicSlice {
            /// The window's size on each axis.
            sizes: Vec<usize>,
        } => tag 29, name "dynamic_slice", class Layout, inputs Some(2), outputs Some(1),
            effects |_library| Effects::PURE;
        /// `x` with the window at `starts` (clamped as `DynamicSlice`'s)
        /// replaced by `update`; inputs (x, update, starts).
        DynamicUpdateSlice => tag 30, name "dynamic_update_slice", class Layout, inputs Some(3), outputs Some(1),
            effects |_library| Effects::PURE;
        /// `x` with a constant border: `pads[i] = (before, after)` on axis `i`.
        Pad {
            /// Elements added before and after, per axis.
            pads: Vec<(usize, usize)>,
            /// The border's value (converted to the dtype).
            value: f64,
        } => tag 31, name "pad", class Layout, inputs Some(1), outputs Some(1),
            effects |_library| Effects::PURE;
        /// Inclusive prefix sums along `axis`.
        Cumsum {
            /// The axis.
            axis: usize,
        } => tag 32, name "cumsum", class Scan, inputs Some(1), outputs Some(1),
            effects |_library| Effects::PURE;
        /// The `k` largest entries along the last axis, largest first (NaN
        /// above every number, ties by index); outputs (values, i64 indices).
        TopK {
            /// How many.
            k: usize,
        } => tag 33, name "top_k", class Scan, inputs Some(1), outputs Some(2),
            effects |_library| Effects::PURE;
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
        } => tag 34, name dist.name(), class Random, inputs Some(if shape.is_some() { 1 } else { 2 }), outputs Some(1),
            effects |_library| Effects::RANDOM;
        /// A 2-D convolution or pooling over NCHW tensors, or one of their
        /// gradients (ONNX `Conv` / `MaxPool` / `AveragePool` semantics); the
        /// table on [`SpatialOp`] lists each one's inputs and outputs. The JIT
        /// runs them through the direct kernels of `tracejit_kernels::conv`
        /// and `pool2d`, the interpreter through the reference loops.
        Spatial(sp: SpatialOp) => tag 35, name sp.name(), class Spatial, inputs Some(sp.num_inputs()), outputs Some(sp.num_outputs()),
            effects |_library| Effects::PURE;
        /// Calls a function of the graph's library; inputs are its arguments,
        /// outputs its results.
        Call {
            /// The callee.
            func: FuncId,
        } => tag 20, name "call", class Call, inputs None, outputs None,
            effects |library| library.try_get(*func).map_or(Effects::WRITES, |f| f.graph.effects());
        /// A fused region: `body` is a graph of elementwise ops (and reductions
        /// ending in them) whose params are this node's inputs and whose outputs
        /// are this node's outputs. The fusion pass creates it; the JIT compiles
        /// `body` into one kernel; the interpreter runs `body`.
        Fused {
            /// The region's computation.
            body: std::sync::Arc<crate::Graph>,
        } => tag 21, name "fused", class Region, inputs Some(body.params.len()), outputs Some(body.outputs.len()),
            effects |_library| body.effects();
        /// A conditional: inputs `(pred, operands...)`, `pred` a bool scalar.
        /// `branches[0]` (then) runs when `pred` is true, `branches[1]` (else)
        /// otherwise; each takes the operands as its parameters and returns one
        /// value per output. Only the taken branch runs, so its effects happen
        /// only then.
        Cond {
            /// The then and else graphs.
            branches: [Arc<crate::Graph>; 2],
        } => tag 25, name "cond", class Control, inputs Some(1 + branches[0].params.len()), outputs Some(branches[0].outputs.len()),
            effects |_library| branches[0].effects().union(branches[1].effects());
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
        } => tag 26, name "while", class Control, inputs Some(parts[1].params.len()), outputs Some(parts[1].outputs.len()),
            effects |_library| parts[0].effects().union(parts[1].effects());
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
        } => tag 22, name "kernel", class Kernel, inputs Some(inputs.len()), outputs Some(outputs.len()),
            effects |_library| kernel.effects();
        /// Reads a variable (stateful). No data inputs.
        ReadVariable {
            /// The variable.
            var: VarId,
            /// Part of an update that holds the variable's update lock (TF's
            /// `use_locking`): executors take it before the first locked access
            /// of a run and release it after the last (see [`crate::locks`]).
            /// Printed `locked`.
            locked: bool,
        } => tag 23, name "read_variable", class State, inputs Some(0), outputs Some(1),
            effects |_library| Effects::READS;
        /// Writes a variable (stateful); one input, the value; no outputs.
        AssignVariable {
            /// The variable.
            var: VarId,
            /// Assign, add or subtract.
            kind: AssignKind,
            /// Part of a locked update, as [`Op::ReadVariable`]'s.
            locked: bool,
        } => tag 24, name "assign_variable", class State, inputs Some(1), outputs Some(0),
            effects |_library| Effects::WRITES;
    }
}

impl Op {
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
