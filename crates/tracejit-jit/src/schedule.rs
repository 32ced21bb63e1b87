//! The schedule an [`crate::Executable`] runs: a flat list of steps over a
//! table of value slots, made from a graph by the JIT's codegen passes
//! ([`crate::codegen`]) and only run by the executor.
//!
//! Invariants ([`Schedule::verify`], checked after every codegen pass in
//! debug builds and tests):
//! - every slot a step reads was written by an earlier step (or by the
//!   step's partner, for the second of a pair), and is below `n_slots`;
//! - a slot is written by one step only;
//! - a slot freed at a step is read by no later step and is not an output;
//! - an in-place step writes over an input it frees;
//! - a product paired with a later one (`Pair::First(j)`) names a product
//!   marked `Pair::Second`, and a product run with its consumer
//!   (`Pair::Then(j)`) names the next step, a region marked `Pair::After`.
//!
//! [`Schedule::listing`] prints it, one step a line (what the codegen dumps
//! hold).

use std::fmt::Write as _;
use std::sync::Arc;

use smallvec::SmallVec;
use tracejit_ir::tensor::Storage;
use tracejit_ir::{AssignKind, Graph, NodeId, Op, VarId};

use crate::executor::row_blocks;
use crate::executor::views::View;
use crate::region::CompiledRegion;
use crate::Executable;

/// What one step does.
pub(crate) enum StepKind {
    /// Graph input `n`.
    Param(usize),
    /// A constant (cloned, O(1)).
    Constant(Storage),
    /// A fused region.
    Region(Arc<CompiledRegion>),
    /// A matrix product.
    MatMul,
    /// A matrix product of bf16 (or bf16-rounded f32) operands accumulated
    /// in f32, on the bf16 GEMM (the `bf16_products` pass).
    MatMulBf16(Arc<crate::gemm_bf16::Bf16Product>),
    /// A view of its input (no copy): a transpose, or a gather of one
    /// index.
    View(View),
    /// A reference kernel (or an unsupported fused region, interpreted),
    /// with the fast path lowering chose for it.
    Primitive(Op, Fast),
    /// A registered native kernel (`Op::Kernel`).
    External(Op),
    /// A convolution, pool or gradient of one, run by the direct kernels
    /// of `tracejit_kernels` (f32) or the reference loops (f64); a
    /// convolution by a variable's value or a constant keeps its packed
    /// filter (the `kept_filters` pass).
    Spatial(tracejit_ir::tensor::SpatialOp, Option<Arc<crate::spatial::KeptFilter>>),
    /// A call of a library function.
    Call(Arc<Executable>),
    /// A conditional: the then and else branches, prepared once.
    Cond(Box<[Executable; 2]>),
    /// A loop: the condition and the body, prepared once, how many of the
    /// inputs are carried, and its split into row blocks when the
    /// `row_loops` pass found one.
    While(Box<[Executable; 2]>, usize, Option<Box<row_blocks::Split>>),
    /// Reads a variable.
    Read(VarId),
    /// Writes a variable.
    Assign(VarId, AssignKind),
    /// Subtracts scattered rows from a variable in place, on the rows
    /// named (the `sparse_updates` pass); inputs: ids, rows, and the scale
    /// when it is not a constant.
    SparseUpdate(Arc<crate::executor::sparse_update::SparseUpdate>),
}

/// The fast path of a reference step, chosen when the schedule is lowered
/// (and by the `in_place` pass) and printed in its listing. Each has a
/// run-time guard (sizes, layouts, a buffer still unique) and runs the
/// reference kernel when the guard fails, computing the same values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fast {
    /// The reference kernel.
    None,
    /// A binary op of two 0-d operands of a compiled dtype (a loop's
    /// `i < n`, `i + 1`), computed without broadcasting or allocating
    /// (`executor::scalars`).
    Scalar,
    /// A reshape or concat of f32 values copied by the pool's threads into
    /// a pooled buffer (`executor::copies`).
    Copy,
    /// A dynamic update slice writing its window into the dying updated
    /// buffer (`executor::windows`; set by the `in_place` pass).
    UpdateInPlace,
}

impl Fast {
    /// The fast path for a reference step running `node`.
    pub fn of(g: &Graph, node: &tracejit_ir::Node) -> Fast {
        let compiled = |v: &tracejit_ir::ValueId| {
            let t = g.value_type(*v);
            t.rank() == 0 && crate::analysis::compiled_dtype(t.dtype)
        };
        let f32_out = node.outputs.first().is_some_and(|t| t.dtype == tracejit_ir::tensor::DType::F32);
        match &node.op {
            Op::Binary(_) if node.inputs.iter().all(compiled) => Fast::Scalar,
            Op::Reshape { .. } | Op::Concat { .. } if f32_out => Fast::Copy,
            _ => Fast::None,
        }
    }

    /// The listing's note: empty for the reference kernel.
    fn note(self) -> &'static str {
        match self {
            Fast::None => "",
            Fast::Scalar => " (0-d fast path)",
            Fast::Copy => " (parallel copy if large)",
            Fast::UpdateInPlace => " (window written in place)",
        }
    }
}

/// A step's part in a pair of steps run together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pair {
    /// Not paired.
    None,
    /// Runs the later step `j`'s product alongside its own, when the pool
    /// has more than one thread (the `side_by_side` pass).
    First(usize),
    /// Already computed by its partner when its output slot is filled.
    Second,
    /// A product run with its consumer, the region at step `j`, in row
    /// halves (the `epilogues` pass).
    Then(usize),
    /// A region already run by the product before it when its output slot
    /// is filled.
    After,
}

/// One step.
pub(crate) struct Step {
    pub kind: StepKind,
    /// The node (the last member for a region), for error messages.
    pub node: NodeId,
    pub inputs: SmallVec<[usize; 3]>,
    pub outputs: SmallVec<[usize; 1]>,
    /// Slots whose last use is this step.
    pub frees: SmallVec<[usize; 2]>,
    /// A region's input (by position) whose buffer its output may take
    /// in place, the input dying here ([`CompiledRegion::may_write_in_place`]).
    pub in_place: Option<usize>,
    /// Whether this step runs together with another ([`Pair`]).
    pub pair: Pair,
    /// Re-check types on concrete operands (some static dim is unknown).
    pub check: bool,
    /// Ask the allocator before running: a static output is big enough to
    /// probe (see `tracejit_tensor::check_allocation`), or unknown.
    pub probe: bool,
}

/// A graph's steps, the slot table they use, and the slots of the graph's
/// outputs.
pub(crate) struct Schedule {
    pub steps: Vec<Step>,
    pub n_slots: usize,
    pub outputs: Vec<usize>,
}

/// Everything the executor's side asks of a step kind, in one place: its
/// name in profiles ([`StepKind::name`]), its listing ([`StepKind::describe`]),
/// the executables it runs ([`StepKind::subgraphs`]) and how it is counted
/// ([`StepKind::count`]); what it runs is the match of `Executable::run_steps`.
impl StepKind {
    /// The kind's name in profiles ([`crate::StepTime::kind`]).
    pub fn name(&self) -> &'static str {
        match self {
            StepKind::Param(_) => "param",
            StepKind::Constant(_) => "constant",
            StepKind::Region(_) => "region",
            StepKind::MatMul => "gemm",
            StepKind::MatMulBf16(_) => "gemm_bf16",
            StepKind::View(_) => "view",
            StepKind::Primitive(..) => "reference",
            StepKind::External(_) | StepKind::Spatial(..) => "native",
            StepKind::Call(_) => "call",
            StepKind::Cond(_) => "cond",
            StepKind::While(..) => "while",
            StepKind::Read(_) => "read",
            StepKind::Assign(..) => "assign",
            StepKind::SparseUpdate(_) => "sparse_update",
        }
    }

    /// The executables the step runs, with their names in profile paths.
    pub fn subgraphs(&self) -> Vec<(&'static str, &Executable)> {
        match self {
            StepKind::Call(e) => vec![("call", &**e)],
            StepKind::Cond(subs) => vec![("then", &subs[0]), ("else", &subs[1])],
            StepKind::While(subs, ..) => vec![("cond", &subs[0]), ("body", &subs[1])],
            _ => Vec::new(),
        }
    }

    /// Adds the step to `st` (see [`crate::ScheduleStats`]'s fields).
    pub fn count(&self, st: &mut crate::ScheduleStats) {
        match self {
            StepKind::Param(_) | StepKind::Constant(_) => {}
            StepKind::Region(_) => st.regions += 1,
            StepKind::MatMul => st.gemms += 1,
            StepKind::MatMulBf16(_) => {
                st.gemms += 1;
                st.bf16_gemms += 1;
            }
            StepKind::Primitive(..) => st.fallbacks += 1,
            StepKind::View(_) => st.views += 1,
            StepKind::External(_) | StepKind::Spatial(..) => st.native_kernels += 1,
            StepKind::Call(e) => {
                st.calls += 1;
                st.add(&e.stats());
            }
            StepKind::Cond(subs) | StepKind::While(subs, ..) => {
                st.control_flow += 1;
                st.row_loops += usize::from(matches!(self, StepKind::While(_, _, Some(_))));
                subs.iter().for_each(|e| st.add(&e.stats()));
            }
            StepKind::Read(_) => st.reads += 1,
            StepKind::Assign(..) => st.writes += 1,
            StepKind::SparseUpdate(_) => {
                st.writes += 1;
                st.sparse_updates += 1;
            }
        }
    }

    /// The step's line in listings.
    fn describe(&self, g: &Graph, node: NodeId) -> String {
        match self {
            StepKind::Param(i) => format!("param {i}"),
            StepKind::Constant(c) => format!("constant {}{:?}", c.dtype(), c.shape()),
            StepKind::Region(r) => {
                let ops = match &g.node(node).op {
                    Op::Fused { body } => body
                        .nodes()
                        .filter(|(_, n)| !n.op.is_source())
                        .map(|(_, n)| n.op.name())
                        .collect::<Vec<_>>()
                        .join(","),
                    op => op.name().to_string(),
                };
                match r.native_kernel() {
                    Some(k) => format!("region {ops} ({k})"),
                    None => format!("region {ops}"),
                }
            }
            StepKind::MatMul => "matmul".to_string(),
            StepKind::MatMulBf16(p) => p.describe(),
            StepKind::View(View::Transpose(perm)) => format!("view transpose {perm:?}"),
            StepKind::View(View::Index(axis)) => format!("view index axis {axis}"),
            StepKind::Primitive(op, fast) => format!("reference {}{}", op.name(), fast.note()),
            StepKind::External(Op::Kernel { name, .. }) => format!("kernel {name}"),
            StepKind::External(op) => format!("kernel {}", op.name()),
            StepKind::Spatial(op, kept) => format!("kernel {}", crate::spatial::step_name(op, kept.as_deref())),
            StepKind::Call(e) => format!("call {}", e.graph().name),
            StepKind::Cond(_) => "cond".to_string(),
            StepKind::While(_, carried, split) => match split {
                Some(s) => format!("while ({carried} carried; {})", s.describe()),
                None => format!("while ({carried} carried)"),
            },
            StepKind::Read(var) => format!("read {var}"),
            StepKind::Assign(var, kind) => format!("{} {var}", kind.name()),
            StepKind::SparseUpdate(u) => u.describe(),
        }
    }
}

fn slots(s: &[usize]) -> String {
    s.iter().map(|x| format!("s{x}")).collect::<Vec<_>>().join(", ")
}

impl Schedule {
    /// The schedule as text, one step a line:
    /// `3: s4 = matmul s1, s2  ; %7  frees s1  side by side with 5`; a
    /// step running other executables (a loop's condition and body, a
    /// conditional's branches, a callee) is followed by their listings.
    pub fn listing(&self, g: &Graph) -> String {
        let mut out = format!("schedule {} ({} slots) {{\n", g.name, self.n_slots);
        for (i, s) in self.steps.iter().enumerate() {
            let lhs = if s.outputs.is_empty() { String::new() } else { format!("{} = ", slots(&s.outputs)) };
            let _ = write!(out, "  {i}: {lhs}{}", s.kind.describe(g, s.node));
            if !s.inputs.is_empty() {
                let _ = write!(out, " {}", slots(&s.inputs));
            }
            let _ = write!(out, "  ; %{}", s.node.as_u32());
            if !s.frees.is_empty() {
                let _ = write!(out, "  frees {}", slots(&s.frees));
            }
            if let Some(p) = s.in_place {
                let _ = write!(out, "  in place of input {p}");
            }
            match s.pair {
                Pair::None => {}
                Pair::First(j) => {
                    let _ = write!(out, "  side by side with {j}");
                }
                Pair::Second => out.push_str("  (run by its partner)"),
                Pair::Then(j) => {
                    let _ = write!(out, "  in row halves with {j}");
                }
                Pair::After => out.push_str("  (run with the product before it)"),
            }
            if s.check {
                out.push_str("  checked");
            }
            out.push('\n');
            // The executables the step runs (branches, loop parts, a
            // callee), each listed under it.
            for (name, sub) in s.kind.subgraphs() {
                let _ = writeln!(out, "    {name}:");
                for line in sub.schedule_listing().lines() {
                    let _ = writeln!(out, "    {line}");
                }
            }
        }
        let outputs = if self.outputs.is_empty() { "(none)".to_string() } else { slots(&self.outputs) };
        let _ = writeln!(out, "  outputs {outputs}\n}}");
        out
    }

    /// Checks the invariants of the module documentation; `Err` says which
    /// step breaks which.
    pub fn verify(&self) -> Result<(), String> {
        let n = self.n_slots;
        let mut written: Vec<Option<usize>> = vec![None; n];
        for (i, s) in self.steps.iter().enumerate() {
            for &x in s.inputs.iter().chain(&s.outputs).chain(&s.frees) {
                if x >= n {
                    return Err(format!("step {i} names slot s{x} of {n}"));
                }
            }
            for &x in &s.inputs {
                if written[x].is_none() {
                    return Err(format!("step {i} reads s{x} before any step writes it"));
                }
            }
            for &x in &s.outputs {
                if let Some(j) = written[x] {
                    return Err(format!("step {i} writes s{x}, which step {j} wrote"));
                }
                written[x] = Some(i);
            }
            if let Some(p) = s.in_place {
                let frees_it = s.inputs.get(p).is_some_and(|x| s.frees.contains(x));
                let writes = match &s.kind {
                    StepKind::Region(_) => true,
                    StepKind::Primitive(tracejit_ir::Op::DynamicUpdateSlice, _) => p == 0,
                    StepKind::Spatial(op, _) => op.conv_epilogue().and_then(|e| e.residual) == Some(p),
                    _ => false,
                };
                if !frees_it || !writes {
                    return Err(format!("step {i} writes in place over input {p}, which it does not free"));
                }
            }
            self.verify_pair(i)?;
        }
        for (i, s) in self.steps.iter().enumerate() {
            for &x in &s.frees {
                if self.outputs.contains(&x) {
                    return Err(format!("step {i} frees s{x}, an output of the graph"));
                }
                if let Some(j) = self.steps[i + 1..].iter().position(|t| t.inputs.contains(&x)) {
                    return Err(format!("step {i} frees s{x}, which step {} reads", i + 1 + j));
                }
            }
        }
        match self.outputs.iter().find(|&&x| x >= n || written[x].is_none()) {
            Some(x) => Err(format!("graph output s{x} is never written")),
            None => Ok(()),
        }
    }

    /// The pairing rules for step `i`.
    fn verify_pair(&self, i: usize) -> Result<(), String> {
        let s = &self.steps[i];
        let partner = |j: usize, want: Pair| -> Result<(), String> {
            match self.steps.get(j) {
                Some(t) if j > i && t.pair == want => Ok(()),
                _ => Err(format!("step {i} is paired with step {j}, which is not marked {want:?}")),
            }
        };
        match s.pair {
            Pair::None | Pair::Second | Pair::After => Ok(()),
            Pair::First(j) => {
                partner(j, Pair::Second)?;
                let product = |k: &StepKind| matches!(k, StepKind::MatMul | StepKind::MatMulBf16(_));
                let both = product(&s.kind) && product(&self.steps[j].kind);
                both.then_some(()).ok_or_else(|| format!("steps {i} and {j} side by side are not both products"))
            }
            Pair::Then(j) => {
                partner(j, Pair::After)?;
                let ok = j == i + 1
                    && matches!(s.kind, StepKind::MatMul | StepKind::MatMulBf16(_))
                    && matches!(self.steps[j].kind, StepKind::Region(_));
                ok.then_some(())
                    .ok_or_else(|| format!("step {i} runs in row halves with step {j}, not the next region"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use smallvec::smallvec;

    use super::*;

    fn step(kind: StepKind, inputs: &[usize], outputs: &[usize], frees: &[usize]) -> Step {
        Step {
            kind,
            node: NodeId::from_u32(0),
            inputs: inputs.into(),
            outputs: outputs.into(),
            frees: frees.into(),
            in_place: None,
            pair: Pair::None,
            check: false,
            probe: false,
        }
    }

    /// `s0, s1` parameters; `s2 = s0 · s1`; `s3 = s0 · s1`; outputs `s2, s3`.
    fn good() -> Schedule {
        Schedule {
            steps: vec![
                step(StepKind::Param(0), &[], &[0], &[]),
                step(StepKind::Param(1), &[], &[1], &[]),
                step(StepKind::MatMul, &[0, 1], &[2], &[]),
                step(StepKind::MatMul, &[0, 1], &[3], &[0, 1]),
            ],
            n_slots: 4,
            outputs: vec![2, 3],
        }
    }

    #[test]
    fn the_verifier_accepts_a_good_schedule_and_names_what_breaks_one() {
        assert_eq!(good().verify(), Ok(()));
        let mut paired = good();
        paired.steps[2].pair = Pair::First(3);
        paired.steps[3].pair = Pair::Second;
        assert_eq!(paired.verify(), Ok(()));

        type Breaks = fn(&mut Schedule);
        let broken: [(&str, Breaks); 7] = [
            ("reads s1 before", |s| s.steps.swap(1, 2)),
            ("which step 2 wrote", |s| s.steps[3].outputs = smallvec![2]),
            ("which step 3 reads", |s| s.steps[2].frees = smallvec![0]),
            ("an output of the graph", |s| s.steps[3].frees.push(2)),
            ("does not free", |s| s.steps[3].in_place = Some(0)),
            ("not marked Second", |s| s.steps[2].pair = Pair::First(3)),
            ("names slot s9", |s| s.steps[2].inputs = smallvec![9, 1]),
        ];
        for (want, breaks) in broken {
            let mut s = good();
            breaks(&mut s);
            let e = s.verify().unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    /// The fast paths are chosen in lowering and shown in the listing, and
    /// each computes what the reference kernel does.
    #[test]
    fn fast_paths_are_in_the_listing_and_agree_with_the_interpreter() {
        let g = Graph::parse(
            "graph fast(%0: i64[], %1: i64[], %2: f32[512, 256], %3: f32[4, 5], %4: f32[2, 2], %5: i64[2]) -> (%6, %8, %11) {
  %6 = add %0, %1 : i64[]
  %7 = transpose[perm=[1, 0]] %2 : f32[256, 512]
  %8 = reshape[shape=[-1]] %7 : f32[131072]
  %9 = constant f32[] 2.0
  %10 = mul %3, %9 : f32[4, 5]
  %11 = dynamic_update_slice %10, %4, %5 : f32[4, 5]
}",
        )
        .unwrap();
        let exe = crate::Executable::new(&g).unwrap();
        let listing = exe.schedule_listing();
        for note in
            ["reference add (0-d fast path)", "reference reshape (parallel copy if large)", "(window written in place)"]
        {
            assert!(listing.contains(note), "no `{note}` in\n{listing}");
        }
        let big: Vec<f32> = (0..131072).map(|i| (i as f32).sin()).collect();
        let inputs = [
            Storage::scalar(40i64),
            Storage::scalar(2i64),
            Storage::from_vec(big, &[512, 256]).unwrap(),
            Storage::from_vec((0..20).map(|i| i as f32 - 7.5).collect::<Vec<_>>(), &[4, 5]).unwrap(),
            Storage::from_vec(vec![1.0f32, -2.0, 3.0, f32::NAN], &[2, 2]).unwrap(),
            Storage::from_vec(vec![1i64, 9], &[2]).unwrap(),
        ];
        let got = exe.run(&inputs).unwrap();
        let want = tracejit_ir::interpret(&g, &inputs).unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!(a.bit_eq(b), "{a:?} vs {b:?}");
        }
        assert!(got[0].bit_eq(&Storage::scalar(42i64)));
    }

    /// A region call whose shapes fit no loop nest (one output broadcasts
    /// to less than the domain) runs in the interpreter and is counted.
    #[test]
    fn region_calls_run_by_the_interpreter_are_counted() {
        let g = Graph::parse(
            "graph two(%0: f32[?], %1: f32[?]) -> (%2, %2.1) {
  %2, %2.1 = fused[4 nodes] %0, %1 : f32[?], f32[?]
    graph two.fused0(%0: f32[?], %1: f32[?]) -> (%2, %3) {
      %2 = exp %0 : f32[?]
      %3 = add %0, %1 : f32[?]
    }
}",
        )
        .unwrap();
        let exe = crate::Executable::from_optimized(&g, &crate::JitOptions::default(), None).unwrap();
        assert_eq!(exe.stats().regions, 1, "{}", exe.schedule_listing());
        let v = |x: Vec<f32>| Storage::from_vec(x.clone(), &[x.len()]).unwrap();
        let same = [v(vec![0.5, -1.0, 2.0, f32::NAN]), v(vec![1.0, 2.0, 3.0, 4.0])];
        exe.run(&same).unwrap();
        assert_eq!(exe.interpreted_region_runs(), 0);
        let broadcast = [v(vec![0.5]), v(vec![1.0, 2.0, 3.0, 4.0])];
        let got = exe.run(&broadcast).unwrap();
        assert_eq!(exe.interpreted_region_runs(), 1);
        let want = tracejit_ir::interpret(&g, &broadcast).unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!(a.bit_eq(b), "{a:?} vs {b:?}");
        }
    }
}
