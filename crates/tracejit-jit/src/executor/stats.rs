//! What a compiled schedule runs, counted by kind of step
//! ([`Executable::stats`]).

use super::Executable;

/// What one run of an [`Executable`] executes, counted by kind of step
/// ([`Executable::stats`]). Parameters and constants cost nothing and are
/// not counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScheduleStats {
    /// Fused regions compiled by the JIT: one kernel call each.
    pub regions: usize,
    /// Matrix products through the GEMM.
    pub gemms: usize,
    /// Of the `gemms`, those on the bf16 GEMM (bf16 or bf16-rounded
    /// operands, f32 accumulation: `matmul_acc`, mixed precision).
    pub bf16_gemms: usize,
    /// Registered native kernels (composites swapped for their kernel).
    pub native_kernels: usize,
    /// Ops run by the reference kernels instead (shape ops such as
    /// `reshape`, and anything the JIT does not compile).
    pub fallbacks: usize,
    /// Views made without copying or a kernel: transposes, and gathers of
    /// one index (a loop's `x[t]`). Not counted as kernels.
    pub views: usize,
    /// Variable reads.
    pub reads: usize,
    /// Variable writes.
    pub writes: usize,
    /// Of the `writes`, sparse updates: `w -= lr · scatter_add(0, ids,
    /// rows)` subtracted in place on the rows the ids name (plain SGD on
    /// an embedding's gradient; the `sparse_updates` pass).
    pub sparse_updates: usize,
    /// Calls of library functions (their steps are counted in the fields
    /// above).
    pub calls: usize,
    /// `cond` and `while` nodes. Their subgraphs' steps are counted in the
    /// fields above once each: both branches of a `cond` (one runs per
    /// call), a `while`'s condition and body (they run once per trip).
    pub control_flow: usize,
    /// `while` nodes whose batch rows never meet: with more than one
    /// thread each block of rows runs the whole loop on its own thread
    /// (one fork and join per call instead of one per trip).
    pub row_loops: usize,
}

impl ScheduleStats {
    /// Adds `other`'s counts to these.
    pub(crate) fn add(&mut self, other: &ScheduleStats) {
        let ScheduleStats {
            regions,
            gemms,
            bf16_gemms,
            native_kernels,
            fallbacks,
            views,
            reads,
            writes,
            sparse_updates,
            calls,
            control_flow,
            row_loops,
        } = *other;
        self.regions += regions;
        self.views += views;
        self.gemms += gemms;
        self.bf16_gemms += bf16_gemms;
        self.native_kernels += native_kernels;
        self.fallbacks += fallbacks;
        self.reads += reads;
        self.writes += writes;
        self.sparse_updates += sparse_updates;
        self.calls += calls;
        self.control_flow += control_flow;
        self.row_loops += row_loops;
    }

    /// Every step that computes: regions, GEMMs, native kernels and
    /// fallbacks.
    pub fn kernels(&self) -> usize {
        self.regions + self.gemms + self.native_kernels + self.fallbacks
    }
}

impl std::fmt::Display for ScheduleStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} kernels: {} fused regions, {} GEMMs ({} bf16), {} native kernels, {} reference ops; {} views, \
             {} variable reads, {} writes ({} sparse), {} calls, {} control-flow nodes ({} loops in row blocks)",
            self.kernels(),
            self.regions,
            self.gemms,
            self.bf16_gemms,
            self.native_kernels,
            self.fallbacks,
            self.views,
            self.reads,
            self.writes,
            self.sparse_updates,
            self.calls,
            self.control_flow,
            self.row_loops
        )
    }
}

impl Executable {
    /// What one run executes, by kind of step, with the steps of called
    /// functions counted in (a callee is prepared once but runs once per
    /// call step).
    ///
    /// ```
    /// use tracejit_ir::tensor::{BinaryOp, DType, Storage, UnaryOp};
    /// use tracejit_ir::{Graph, Op, TensorType, ValueId};
    /// use tracejit_jit::Executable;
    ///
    /// // relu(x @ w + 1): the product is a GEMM, the bias and relu one kernel.
    /// let mut g = Graph::new("dense");
    /// let x = g.add_param(TensorType::known(DType::F32, &[4, 3]));
    /// let w = g.add_param(TensorType::known(DType::F32, &[3, 2]));
    /// let one = g.add_constant(Storage::scalar(1.0f32));
    /// let mut op = |g: &mut Graph, op, ins: &[ValueId]| ValueId::new(g.add_node(op, ins, &[], None).unwrap(), 0);
    /// let y = op(&mut g, Op::MatMul, &[x, w]);
    /// let z = op(&mut g, Op::Binary(BinaryOp::Add), &[y, one]);
    /// let r = op(&mut g, Op::Unary(UnaryOp::Relu), &[z]);
    /// g.outputs.push(r);
    /// let stats = Executable::new(&g)?.stats();
    /// assert_eq!((stats.gemms, stats.regions, stats.fallbacks), (1, 1, 0));
    /// assert_eq!(stats.kernels(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> ScheduleStats {
        let mut st = ScheduleStats::default();
        for s in &self.schedule.steps {
            s.kind.count(&mut st);
        }
        st
    }
}
