//! Region analysis: decides whether a region body is compilable (`supports`)
//! and, if so, lowers it to the small program the code generator emits.
//!
//! # The domain and its axis classes
//!
//! Every axis of every value in the body is either a *unit* (statically of
//! size 1: a broadcast axis) or belongs to an *axis class*. Classes are found
//! by unification over numpy's right-aligned broadcasting: the two operands of
//! a binary op put their aligned non-unit axes into one class, `expand_dims`
//! inserts a unit, `broadcast_to` adds a fresh class of a static size where it
//! widens a unit, and a reduction turns its reduced axes into units (keepdims)
//! or drops them. After unification the classes, ordered as they appear in the
//! values, form the iteration *domain* `F`; a value indexes the domain through
//! its classes (stride 0 on the others), so the whole region runs as one loop
//! nest over `F` with per-input strides.
//!
//! # What `supports` accepts (exactly)
//!
//! - Live nodes (those reaching an output) are only `Parameter`, `Constant`,
//!   `Unary`, `Binary`, `Select`, `Cast`, `Clamp`, `BroadcastTo`,
//!   `ExpandDims`, `OneHot` and `Reduce`; a constant is either a scalar (one
//!   element, baked into the code) or a tensor of at most
//!   [`MAX_CONST_ELEMENTS`] elements (read like an input). A `one_hot` of
//!   depth at most [`MAX_CONST_ELEMENTS`] adds a class of that size after
//!   its labels' and lowers to `cast(labels == iota)`, the iota a constant
//!   `[0, depth)` read along the new class.
//! - No value holds one class on two axes (no "diagonals", such as
//!   `x + expand_dims(x, 1)`), and every value's classes are in domain order.
//! - **Elementwise regions** (no `Reduce`): all outputs have the same classes,
//!   which are the domain.
//! - **Reduction regions**: every `Reduce` has an input whose classes are the
//!   domain and reduces the same set of classes `RA`, none of them a unit.
//!   - `RA` a suffix of the domain (including all of it): a *row* region
//!     (softmax, layernorm, full sums). Reductions may consume values that
//!     depend on earlier reductions, in any number of passes. Each value and
//!     each input holds either all of `RA` or none of it. Outputs hold the
//!     whole domain or exactly the kept classes.
//!   - `RA` a strict prefix: a *column* region (bias gradients). One pass
//!     only: no reduction depends on another, values that depend on a
//!     reduction hold no class of `RA`, and outputs are either the whole
//!     domain (not depending on a reduction) or exactly the kept classes.
//!     Each value and each input holds either all kept classes or none.
//!
//! Anything else returns an explanation, and the planner leaves the nodes to
//! the reference kernels.

use cranelift_entity::{entity_impl, PrimaryMap};
use smallvec::SmallVec;
use tracejit_ir::tensor::{BinaryOp, DType, ReduceOp, Storage, UnaryOp};
use tracejit_ir::Graph;

use crate::options::KernelKey;
pub(crate) use crate::scalar::Scalar;

mod axes;
mod domain;
mod region_program;
mod text;
mod unify;

/// Constants larger than this are not folded into a region.
pub const MAX_CONST_ELEMENTS: usize = 1 << 16;

/// The three loop structures a region compiles to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum KernelKind {
    /// No reduction: one loop nest over the domain.
    Elementwise,
    /// Reductions over trailing classes, row by row, in passes.
    Row,
    /// Reductions over leading classes, accumulated into per-column buffers.
    Column,
}

/// A node of the lowered program (`n3`): an index into [`Analysis::nodes`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct LNodeId(u32);
entity_impl!(LNodeId, "n");

/// An input slot of a kernel (`load2`): an index into [`Analysis::loads`].
/// A kernel's argument slots are its loads, then its outputs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct LoadId(u32);
entity_impl!(LoadId, "load");

/// An operation of the lowered program.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum LOp {
    /// Reads an input slot (a parameter or a tensor constant).
    Load(LoadId),
    /// A scalar immediate.
    Const(Scalar),
    Unary(UnaryOp),
    Binary(BinaryOp),
    Select,
    Cast,
    /// Bounds already converted to the operand's dtype.
    Clamp(Scalar, Scalar),
    Reduce(ReduceOp),
}

/// A node of the lowered program; `inputs` index earlier nodes.
#[derive(Clone, Debug)]
pub(crate) struct LNode {
    pub op: LOp,
    pub inputs: SmallVec<[LNodeId; 3]>,
    /// Result dtype.
    pub dtype: DType,
    /// True when the value changes along the inner (vectorized) loop.
    pub varying: bool,
    /// Number of reductions on the longest dependency chain (row regions).
    pub stage: u32,
}

/// Where an input slot's data comes from.
#[derive(Clone, Debug)]
pub(crate) enum LoadSource {
    /// Region parameter `n`.
    Param(usize),
    /// A tensor constant of the body (standard layout).
    Const(Storage),
}

/// An input slot.
#[derive(Clone, Debug)]
pub(crate) struct LoadInfo {
    pub source: LoadSource,
    pub dtype: DType,
    /// For each axis of the input: its domain position, or `None` for a unit.
    pub axes: Vec<Option<usize>>,
    /// True when the input varies along the inner loop (read as vectors).
    pub contig: bool,
}

/// An output slot.
#[derive(Clone, Debug)]
pub(crate) struct OutputInfo {
    /// The lowered node stored there.
    pub node: LNodeId,
    pub dtype: DType,
    /// For each axis of the output: its domain position, or `None` for a unit.
    pub axes: Vec<Option<usize>>,
    /// True for a kept-level output of a reduction region.
    pub kept: bool,
}

/// A runtime size source of a domain class.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SizeSource {
    pub param: usize,
    pub axis: usize,
}

/// Everything the code generator and the launcher need about a region.
#[derive(Clone, Debug)]
pub(crate) struct Analysis {
    pub kind: KernelKind,
    pub nodes: PrimaryMap<LNodeId, LNode>,
    pub loads: PrimaryMap<LoadId, LoadInfo>,
    pub outputs: Vec<OutputInfo>,
    /// Domain rank.
    pub rank: usize,
    /// Row: the reduced classes are `split..rank`; Column: `0..split`;
    /// Elementwise: `rank - 1` (the statically inner class) or 0 when rank is 0.
    pub split: usize,
    /// Per domain class: the parameter axes giving its runtime size.
    pub size_sources: Vec<Vec<SizeSource>>,
    /// Per domain class: a statically known size, if any.
    pub static_sizes: Vec<Option<usize>>,
    /// Highest reduction stage (row regions); 0 otherwise.
    pub passes: u32,
    /// True if some reduction is max or min (an empty reduced extent is an error).
    pub has_max_min: bool,
    /// The structural key of the kernel (with the options, the cache key).
    pub key: KernelKey,
}

/// True for the dtypes regions compute in: f32, f64, i32, i64 and bool.
/// The 16-bit floats, the narrow integers and u64 take the reference
/// kernels.
pub(crate) fn compiled_dtype(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::I32 | DType::I64 | DType::Bool)
}

/// Why a node of a region body stays out of compiled regions, if it does:
/// the 16-bit floats and u64 (no unsigned compare or divide here) run
/// through the reference kernels; the narrow integers compile in their
/// compute dtype (loads extend, stores truncate, each op's result wraps
/// back) except in reductions, whose identities and accumulators are kept
/// in the compute dtypes' terms.
fn unsupported(n: &tracejit_ir::Node, body: &Graph) -> Option<String> {
    let out = n.outputs.first()?.dtype;
    let not_compiled = |d: DType| !(compiled_dtype(d) || d.is_narrow_int());
    if let Some(t) = n.outputs.iter().find(|t| not_compiled(t.dtype)) {
        return Some(format!("{} on {} is not compiled into regions", n.op.name(), t.dtype));
    }
    let narrow_in = n.inputs.iter().any(|v| body.value_type(*v).dtype.is_narrow_int());
    let reduces = matches!(n.op, tracejit_ir::Op::Reduce { .. } | tracejit_ir::Op::OneHot { .. });
    (reduces && (narrow_in || out.is_narrow_int()))
        .then(|| format!("{} on {out} (a narrow integer) is not compiled into regions", n.op.name()))
}

/// Analyzes a region body, as a list of named steps: liveness,
/// unification of axes, the domain, lowering, the outputs, the passes of
/// reductions, and the runtime sizes. `Err` carries why the body is not
/// supported.
pub(crate) fn analyze(body: &Graph) -> Result<Analysis, String> {
    // Regions compute in f32, f64 and the integers: the 16-bit floats run
    // through the reference kernels (f32 arithmetic, rounded once), and
    // products on them through the bf16 GEMM (`crate::gemm`).
    // u64 likewise; the narrow integers compile in their compute dtype.
    if let Some(why) = body.nodes().find_map(|(_, n)| unsupported(n, body)) {
        return Err(why);
    }
    let live = axes::liveness(body)?;
    let mut unified = axes::unify(body, &live)?;
    let domain = domain::domain(body, &live, &mut unified)?;
    let mut lowered = region_program::lower(body, &live, &domain)?;
    let outputs = region_program::outputs(body, &domain, &mut lowered)?;
    let passes = region_program::passes(&live, &domain, &lowered)?;
    let (size_sources, static_sizes) = region_program::sizes(&mut unified, &domain)?;
    Ok(Analysis {
        kind: domain.kind,
        nodes: lowered.nodes,
        loads: lowered.loads,
        outputs,
        rank: domain.rank,
        split: domain.split,
        size_sources,
        static_sizes,
        passes,
        has_max_min: lowered.has_max_min,
        key: lowered.key,
    })
}
