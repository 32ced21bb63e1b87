//! Graph passes and the pass manager: Grappler-style rewrites between tracing
//! and execution.
//!
//! A pass is a named struct implementing [`Pass`]: it rewrites a [`Graph`] in
//! place and says what it changed ([`PassResult`]). The order in which passes
//! run is data — [`Pipeline::default_pipeline`] is a literal list of stages
//! that reads top to bottom — and [`Pipeline::run`] verifies the graph after
//! every pass (in debug builds and tests), iterates the simplification group
//! to a fixpoint under an iteration cap, times every pass, and, with
//! `TRACEJIT_DUMP=<dir>`, writes the graph before and after each pass as text
//! and DOT.
//!
//! The passes, one file each:
//!
//! | name | struct | what |
//! |---|---|---|
//! | `inline` | [`Inline`] | inlines every `Call`, except composites (`implements`) while the selector is still to run |
//! | `selector` | [`SelectImplementation`] | a composite `Call` becomes its registered [`Op::Kernel`], or is inlined |
//! | `hoist` | [`HoistLoopProducts`] | a counted loop's `gather(xs, i) @ w` becomes one product `xs @ w` before the loop |
//! | `const_fold` | [`ConstantFolding`] | evaluates small, pure, constant-input nodes with the reference kernels |
//! | `simplify` | [`Simplify`] | algebraic rewrites that are exact under IEEE 754 |
//! | `cse` | [`Cse`] | merges structurally identical pure nodes |
//! | `conv_relu` | [`ConvRelu`] | a `relu` of a convolution moves into its output pass |
//! | `sparse_update` | [`SparseUpdate`] | `assign(w, w - lr · scatter_add(0, ids, rows))` becomes `assign_sub`, which the JIT runs in place on the named rows |
//! | `dce` | [`Dce`] | drops nodes that neither reach an output nor have side effects |
//! | `auto_mixed_precision` | [`AutoMixedPrecision`] | with [`PassContext::mixed_precision`] set: products and convolutions read bf16-rounded operands, accumulate in f32 |
//! | `channels_last` | [`ChannelsLast`] | with [`PassContext::channels_last`] set: an inference graph's chains of convolutions keep their activations `[N, H, W, C]` |
//! | `conv_epilogue` | [`FuseConvEpilogue`] | a channels-last convolution's per-channel scale and shift, residual add and relu move into its store |
//! | `fusion` | [`Fusion`] | groups elementwise chains and reductions into `Op::Fused` regions |
//!
//! Nodes cannot be removed from a graph's arena, so a pass that deletes or
//! replaces nodes rebuilds a compacted graph through the one shared helper,
//! [`Rewriter`]. Every pass leaves a graph the verifier accepts, and running a
//! pass twice changes nothing the second time (both are tested).
//!
//! # What "exact" means here
//!
//! Rewrites never change a result's bits, with one documented exception: the
//! sign and payload of a NaN. IEEE 754 leaves them unspecified for arithmetic
//! results, hardware differs, and the JIT's vector code does not preserve
//! them either; a rewrite may turn a NaN into another NaN (for example
//! `a + neg(b)` into `a - b` when `b` is NaN), never into a number. Signed
//! zeros, infinities and rounding are always preserved.

use std::fmt;
use std::sync::Arc;

use crate::{ExternalKernel, Graph, Op, TensorType};

mod channels_last;
mod const_fold;
mod conv_epilogue;
mod conv_relu;
mod cse;
mod dce;
mod fusion;
mod hoist;
mod inline;
mod int8_products;
mod mixed_precision;
mod pipeline;
mod rewrite;
mod select;
mod simplify;
mod sparse_update;

pub use channels_last::ChannelsLast;
pub use const_fold::ConstantFolding;
pub use conv_epilogue::FuseConvEpilogue;
pub use conv_relu::ConvRelu;
pub use cse::Cse;
pub use dce::Dce;
pub use fusion::{default_accepts_region, Fusion, MAX_REGION_NODES};
pub use hoist::HoistLoopProducts;
pub use inline::Inline;
pub use int8_products::{int8_census, int8_kernel, Int8Census, INT8_KERNEL_NAME};
pub use mixed_precision::AutoMixedPrecision;
pub use pipeline::{FixpointOutcome, OptimizationOptions, PassRecord, PassSnapshot, Pipeline, PipelineReport, Stage};
pub use rewrite::Rewriter;
pub use select::SelectImplementation;
pub use simplify::Simplify;
pub use sparse_update::SparseUpdate;

/// A graph rewrite with a stable name (used to disable it, in reports and
/// in dump file names).
pub trait Pass: Send + Sync {
    /// The pass's name, snake_case: `cse`, `const_fold`.
    fn name(&self) -> &'static str;

    /// Rewrites `g`; the result says whether anything changed. A pass that
    /// reports no change must leave `g` as it was.
    fn run(&self, g: &mut Graph, cx: &PassContext) -> PassResult;

    /// True for the pass that replaces composite calls by kernels: passes
    /// before it keep composite calls ([`PassContext::keep_composites`]),
    /// and [`OptimizationOptions::selector`] switches it.
    fn selects_implementations(&self) -> bool {
        false
    }
}

/// What a pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassResult {
    /// True when the graph changed.
    pub changed: bool,
    /// A short note of what changed (`3 nodes folded`), empty if nothing did.
    pub summary: String,
}

impl PassResult {
    /// Nothing changed.
    pub fn unchanged() -> PassResult {
        PassResult::default()
    }

    /// Something changed, as `summary` says.
    pub fn changed(summary: impl Into<String>) -> PassResult {
        PassResult { changed: true, summary: summary.into() }
    }

    /// `changed(summary)` when `count > 0`, else `unchanged()`.
    pub fn count(count: usize, what: &str) -> PassResult {
        if count == 0 {
            PassResult::unchanged()
        } else {
            PassResult::changed(format!("{count} {what}"))
        }
    }

    /// What this and `other` did together.
    pub fn and(self, other: PassResult) -> PassResult {
        match (self.changed, other.changed) {
            (false, _) => other,
            (true, false) => self,
            (true, true) => PassResult::changed(format!("{}; {}", self.summary, other.summary)),
        }
    }
}

/// Runs `pass` inside every subgraph of `g`'s nodes ([`Op::subgraphs`]);
/// the pass's own `run` recurses further down. A subgraph is replaced only
/// when the pass changed it, so bodies shared between nodes stay shared.
/// Passes that apply inside nested code call this first, then rewrite `g`.
pub fn run_in_subgraphs(pass: &dyn Pass, g: &mut Graph, cx: &PassContext) -> PassResult {
    let holders: Vec<crate::NodeId> =
        g.nodes().filter(|(_, n)| !n.op.subgraphs().is_empty()).map(|(id, _)| id).collect();
    let mut changed = 0usize;
    for id in holders {
        for sub in g.node_mut(id).op.subgraphs_mut() {
            let mut inner = (**sub).clone();
            if pass.run(&mut inner, cx).changed {
                *sub = Arc::new(inner);
                changed += 1;
            }
        }
    }
    PassResult::count(changed, if changed == 1 { "subgraph rewritten" } else { "subgraphs rewritten" })
}

/// Where the implementation selector finds native kernels for composite
/// ops: [`crate::registry::global`] (the process-wide table that
/// `tracejit::composite` fills), or a table of a test's own.
pub trait KernelRegistry: Send + Sync {
    /// A kernel registered for the composite op `name` that accepts inputs
    /// of these types (unknown dims may be `None`), if there is one.
    fn lookup(&self, name: &str, inputs: &[TensorType]) -> Option<Arc<dyn ExternalKernel>>;
}

/// Decides whether a candidate fused region (its body graph) may be formed:
/// the fusion planner only builds regions the executor accepts. The JIT
/// plugs in its own rule (`tracejit_jit::supports`); the default is
/// [`default_accepts_region`].
pub type AcceptRegion = Arc<dyn Fn(&Graph) -> bool + Send + Sync>;

/// Default largest constant (in elements) that constant folding creates.
pub const DEFAULT_FOLD_LIMIT: usize = 1024;

/// What passes may consult besides the graph: the function's name, the
/// composite kernel registry, the fusion acceptance rule, limits, and
/// whether composite calls must wait for the selector. Cheap to clone.
#[derive(Clone)]
pub struct PassContext {
    /// The function being optimized (reports, dump file names).
    pub function: String,
    /// The composite kernels; `None`: every composite call is inlined.
    pub kernels: Option<Arc<dyn KernelRegistry>>,
    /// Which fused regions may be formed.
    pub accept_region: AcceptRegion,
    /// Constant folding creates no constant with more elements than this.
    pub fold_limit: usize,
    /// True while the implementation selector is still to run: the inliner
    /// then keeps calls of functions marked `implements`. The pipeline sets
    /// it before each pass.
    pub keep_composites: bool,
    /// True when a gradient tape is to differentiate the graph: the inliner
    /// keeps calls of custom-gradient functions
    /// ([`crate::autodiff::is_custom_gradient`]), whose gradient is the
    /// user's rule, not their body's. Otherwise they are inlined like plain
    /// calls (never kept for the selector or exported as composites).
    pub keep_custom_gradients: bool,
    /// The file name prefix of graph dumps; `None`: the function's name.
    pub dump_prefix: Option<String>,
    /// The low dtype (`BF16` or `F16`) `auto_mixed_precision` rounds
    /// products' operands to; `None` (the default): products stay f32
    /// unless `int8_products` takes them.
    pub mixed_precision: Option<tracejit_tensor::DType>,
    /// `auto_mixed_precision` puts every f32 product against a weight (a
    /// variable's value or a constant) in dynamic int8
    /// ([`INT8_KERNEL_NAME`]); the other products follow
    /// `mixed_precision`. Off by default; `tracejit::quantize::dynamic`
    /// turns it on.
    pub int8_products: bool,
    /// `channels_last` keeps inference graphs' chains of convolutions
    /// channels last (`conv2d_nhwc`). Off by default; a JIT function's
    /// pipeline sets it where the CPU has the vector code its kernels
    /// need.
    pub channels_last: bool,
}

impl PassContext {
    /// A context with no kernel registry, the default fusion rule and the
    /// default folding limit.
    pub fn new(function: impl Into<String>) -> PassContext {
        PassContext {
            function: function.into(),
            kernels: None,
            accept_region: Arc::new(default_accepts_region),
            fold_limit: DEFAULT_FOLD_LIMIT,
            keep_composites: false,
            keep_custom_gradients: false,
            dump_prefix: None,
            mixed_precision: None,
            int8_products: false,
            channels_last: false,
        }
    }

    /// Uses `kernels` for the implementation selector.
    pub fn with_kernels(mut self, kernels: Arc<dyn KernelRegistry>) -> PassContext {
        self.kernels = Some(kernels);
        self
    }

    /// Uses `accept` to decide which fused regions may be formed.
    pub fn with_region_acceptor(mut self, accept: AcceptRegion) -> PassContext {
        self.accept_region = accept;
        self
    }
}

impl fmt::Debug for PassContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PassContext")
            .field("function", &self.function)
            .field("kernels", &self.kernels.is_some())
            .field("fold_limit", &self.fold_limit)
            .field("keep_composites", &self.keep_composites)
            .field("keep_custom_gradients", &self.keep_custom_gradients)
            .field("mixed_precision", &self.mixed_precision)
            .finish()
    }
}

/// True when running node `op` may have an effect besides its outputs (see
/// [`Op::effects`]): a variable read or write, a random draw, or nested code
/// or a callee that has one. Such nodes are never folded, merged or dropped.
pub fn has_side_effects(g: &Graph, op: &Op) -> bool {
    !op.effects(&g.library).is_pure()
}

/// True when some node of `g` has side effects.
pub fn graph_has_side_effects(g: &Graph) -> bool {
    !g.effects().is_pure()
}
