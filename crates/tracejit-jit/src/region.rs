//! Compiled regions: the kernel cache, and the launcher that turns concrete
//! inputs into one kernel call (or a few).
//!
//! A [`CompiledRegion`] pairs a cached kernel (shared by every region with the
//! same structure, whatever its static sizes) with what this region needs at
//! run time: the input types to check, the axis classes of the domain, its
//! tensor constants, and — when every input dimension is static — a launch
//! plan computed once, so that a call only checks shapes, allocates outputs
//! and calls the kernel.
//!
//! Launch: the sizes of the domain classes come from the inputs; each slot
//! (input or output) gets a stride per class (0 where it broadcasts); the
//! inner classes must be contiguous in every input read as vectors (an input
//! that broadcasts there at run time, which the static types could not tell,
//! is first materialized with `broadcast_to`); the outer classes are
//! collapsed where strides allow, the last one becomes the kernel's rows and
//! the rest are looped over here. Inputs not in standard layout are copied to
//! it first ([`Storage::to_standard`]).
//!
//! When the concrete shapes do not fit one loop nest — two inputs broadcast
//! against each other in a way that differs between outputs, a size conflict
//! that the reference reports as an error, or `max`/`min` over an empty axis —
//! the region runs the body with the interpreter instead, which returns the
//! reference result or the reference error.

use cranelift_entity::EntityRef;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use smallvec::SmallVec;
use tracejit_ir::tensor::{kernels, Storage};
use tracejit_ir::{Graph, IrError, TensorType};

use crate::analysis::{analyze, Analysis, KernelKind, LoadId, LoadSource};
use crate::dispatch::Calls;
use crate::jit::{self, KernelCode};
use crate::kernel::{self, Schedule};
use crate::options::{JitOptions, KernelKey};
use crate::JitError;

mod epilogue;
mod output;

pub(crate) use crate::pool::BufPool;
pub(crate) use epilogue::Product;
use output::OutBuf;
pub(crate) use output::{data_ptr, same_shape, unique_mut_ptr};

/// A compiled kernel and its scratch plan, shared through the cache.
pub(crate) struct Kernel {
    code: KernelCode,
    schedule: Schedule,
    /// The hand-written kernel's name when `code` is one (`crate::native`).
    native: Option<&'static str>,
    /// The code as a compile cache entry (`crate::cache_entry`; `None` for
    /// a hand-written kernel): what the cache directory and artifacts store.
    entry: Option<Arc<[u8]>>,
}

/// Kernels by their structure and the options they were built with.
type KernelCache = HashMap<(KernelKey, JitOptions), Arc<Kernel>>;

fn cache() -> &'static Mutex<KernelCache> {
    static CACHE: OnceLock<Mutex<KernelCache>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Number of distinct kernels compiled so far in this process (for stats).
pub fn kernel_cache_len() -> usize {
    cache().lock().map(|c| c.len()).unwrap_or(0)
}

/// The lowered program the JIT emits for a region body, as text (one line
/// per load, node and output; see the lowering filetests in
/// `tests/lowering/`), or why the JIT does not compile the body.
///
/// ```
/// use tracejit_ir::Graph;
///
/// let body = Graph::parse("graph r(%0: f32[4, 8]) -> (%1) {\n  %1 = tanh %0 : f32[4, 8]\n}")?;
/// let program = tracejit_jit::region_program(&body).unwrap();
/// assert!(program.starts_with("kernel elementwise (rank 2"), "{program}");
/// assert!(program.contains("n1 = tanh n0 : f32 varying"), "{program}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn region_program(body: &Graph) -> Result<String, String> {
    analyze(body).map(|a| a.to_string())
}

/// True if `body` is a region this JIT compiles (the fusion pass asks this).
/// See the crate documentation for exactly which regions qualify.
pub fn supports(body: &tracejit_ir::Graph) -> bool {
    analyze(body).is_ok()
}

/// Why `body` is not supported, or `None` if it is (for diagnostics).
pub fn unsupported_reason(body: &tracejit_ir::Graph) -> Option<String> {
    analyze(body).err()
}

/// Compiles (or finds in the kernel cache, keyed by the region's structure
/// and input dtypes/ranks) a kernel for `body`, with [`JitOptions::current`].
pub fn compile_region(body: &tracejit_ir::Graph) -> Result<Arc<CompiledRegion>, JitError> {
    compile_region_with(body, &JitOptions::current())
}

/// [`compile_region`] with explicit options (their code-relevant part,
/// the ISA and codegen knobs, is part of the cache key).
pub fn compile_region_with(body: &tracejit_ir::Graph, opts: &JitOptions) -> Result<Arc<CompiledRegion>, JitError> {
    let an = analyze(body).map_err(JitError::Unsupported)?;
    let kernel = cached_kernel(&an, opts)?;
    Ok(region_from(kernel, an, body))
}

/// Whether the cache holds `an`'s kernel for `opts`.
pub(crate) fn is_cached(an: &Analysis, opts: &JitOptions) -> bool {
    cache().lock().unwrap_or_else(|p| p.into_inner()).contains_key(&(an.key.clone(), opts.code_key()))
}

/// `an`'s kernel for `opts`: the cached one, or the persistent compile
/// cache's or a loaded artifact's ([`crate::compile_cache`]), or compiled
/// and cached (in memory and in the cache directory). The
/// cache's lock is not held while Cranelift compiles, so regions compile
/// in parallel (`codegen::graph_to_schedule`); when two threads compile the same key,
/// the first to finish is kept and both return it.
pub(crate) fn cached_kernel(an: &Analysis, opts: &JitOptions) -> Result<Arc<Kernel>, JitError> {
    let key = (an.key.clone(), opts.code_key());
    if let Some(k) = cache().lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(k.clone());
    }
    let schedule = kernel::schedule(an, opts);
    let (code, native, entry) = match crate::native::kernel_for(an, opts) {
        Some(crate::native::NativeKernel { name, entry, plan }) => {
            if opts.dump {
                eprintln!("== kernel {}: the hand-written {name} (crate::native)", an.key);
            }
            (jit::KernelCode::native(entry, plan), Some(name), None)
        }
        None => match crate::compile_cache::lookup(&an.key, opts) {
            Some((code, entry)) => (code, None, Some(entry)),
            None => {
                let (code, image) = jit::compile(an, &schedule, opts)?;
                crate::compile_cache::count_miss();
                (code, None, crate::compile_cache::store(&an.key, opts, &image))
            }
        },
    };
    let k = Arc::new(Kernel { code, schedule, native, entry });
    Ok(cache().lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_insert(k).clone())
}

/// The region of `body` (analyzed as `an`) running `kernel`.
pub(crate) fn region_from(kernel: Arc<Kernel>, an: Analysis, body: &Graph) -> Arc<CompiledRegion> {
    let param_types = body.param_types();
    let cost = crate::dispatch::cost_per_element(&an);
    let mut region = CompiledRegion {
        kernel,
        cost,
        an,
        body: Arc::new(body.clone()),
        param_types,
        static_launch: None,
        static_shapes: None,
        pool: Mutex::new(BufPool::default()),
        interpreted: std::sync::atomic::AtomicU64::new(0),
    };
    let shapes: Option<Vec<Vec<usize>>> = region.param_types.iter().map(|t| t.shape()).collect();
    if let Some(shapes) = shapes {
        let refs: Vec<&[usize]> = shapes.iter().map(|s| &s[..]).collect();
        if let Ok(l) = region.plan(&refs) {
            region.static_launch = Some(l);
            region.static_shapes = Some(shapes);
        }
    }
    Arc::new(region)
}

/// A region compiled to native code; cheap to share (`Send + Sync`), and
/// safe to run from many threads at once.
pub struct CompiledRegion {
    kernel: Arc<Kernel>,
    /// `dispatch::cost_per_element` of `an`, computed once: a walk over
    /// the kernel's ops on every launch cost W1 0.15 µs per call.
    cost: u64,
    an: Analysis,
    body: Arc<Graph>,
    param_types: Vec<TensorType>,
    static_launch: Option<Launch>,
    static_shapes: Option<Vec<Vec<usize>>>,
    /// Outputs of earlier calls, reused once the caller has dropped them.
    pool: Mutex<BufPool>,
    /// Calls whose concrete shapes fit no loop nest of the kernel, run by
    /// the interpreter instead ([`CompiledRegion::interpreted_runs`]).
    interpreted: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for CompiledRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledRegion").field("kind", &self.an.kind).field("key", &self.an.key).finish()
    }
}

/// How one call is laid out.
#[derive(Clone, Debug)]
struct Launch {
    out_shapes: Vec<SmallVec<[usize; 4]>>,
    rows: usize,
    n: usize,
    count: usize,
    /// Byte stride of the kernel's rows, per slot.
    row_strides: SmallVec<[isize; 8]>,
    /// Dimensions looped over here (outermost first): size and byte stride per slot.
    outer: Vec<(usize, SmallVec<[isize; 8]>)>,
    /// Inputs to broadcast to a shape before the call.
    materialize: Vec<(usize, Vec<usize>)>,
}

/// The concrete shapes do not fit one loop nest: use the interpreter.
struct Fallback;

/// Element strides of a standard-layout array of `shape`.
fn standard_strides(shape: &[usize]) -> SmallVec<[usize; 4]> {
    let mut st: SmallVec<[usize; 4]> = SmallVec::from_elem(0, shape.len());
    let mut acc = 1;
    for a in (0..shape.len()).rev() {
        st[a] = acc;
        acc *= shape[a];
    }
    st
}

/// Per-class element strides of a slot with `axes` and `shape`.
fn class_strides(axes: &[Option<usize>], shape: &[usize], rank: usize) -> SmallVec<[usize; 4]> {
    let st = standard_strides(shape);
    let mut out: SmallVec<[usize; 4]> = SmallVec::from_elem(0, rank);
    for (a, c) in axes.iter().enumerate() {
        if let Some(c) = c {
            if shape[a] != 1 {
                out[*c] = st[a];
            }
        }
    }
    out
}

impl CompiledRegion {
    /// How many calls so far had concrete shapes no loop nest of the
    /// kernel fits (broadcasts the analysis could not place), and ran the
    /// region's body in the interpreter instead: correct, but slow, so
    /// counted ([`crate::Executable::interpreted_region_runs`]).
    pub fn interpreted_runs(&self) -> u64 {
        self.interpreted.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The name of the hand-written kernel this region runs instead of
    /// generated code (`"row softmax (16 lanes)"`, `"row layer norm (16
    /// lanes)"`, or `(8 lanes)` without AVX-512F), or `None` for generated
    /// code.
    /// Hand-written kernels serve region shapes where Cranelift's 128-bit
    /// code falls short; they take the same arguments and split across
    /// threads the same way.
    pub fn native_kernel(&self) -> Option<&'static str> {
        self.kernel.native
    }

    /// The kernel's compile cache entry (`None` for a hand-written one).
    pub(crate) fn kernel_entry(&self) -> Option<&Arc<[u8]>> {
        self.kernel.entry.as_ref()
    }

    /// Runs on concrete inputs (one per body param, in order); allocates and
    /// returns the outputs.
    ///
    /// # Panics
    ///
    /// On inputs that do not fit the body's parameter types, and where the
    /// reference kernels would panic (the interpreter's error message).
    pub fn run(&self, inputs: &[&Storage]) -> Vec<Storage> {
        self.try_run(inputs).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`CompiledRegion::run`], but returns the interpreter's error
    /// instead of panicking when the inputs do not fit.
    pub fn try_run(&self, inputs: &[&Storage]) -> Result<Vec<Storage>, IrError> {
        let mut pool = BufPool::checkout(&self.pool);
        let outs = self.try_run_pooled(inputs, &mut pool, None);
        if let Ok(outs) = &outs {
            for o in outs {
                pool.give(o.clone());
            }
        }
        pool.checkin(&self.pool);
        Ok(outs?.into_vec())
    }

    /// [`CompiledRegion::try_run`] with outputs taken from `pool` where it
    /// has a free buffer of the right dtype and size.
    ///
    /// `alias`: input `p` may take output 0 in place, its buffer at the
    /// address given ([`CompiledRegion::may_write_in_place`] said so; used
    /// when the launch walks both alike, else ignored).
    pub(crate) fn try_run_pooled(
        &self,
        inputs: &[&Storage],
        pool: &mut BufPool,
        alias: Option<(usize, i64)>,
    ) -> Result<SmallVec<[Storage; 2]>, IrError> {
        let bad = |message: String| IrError::BadInput { graph: self.body.name.clone(), message };
        if inputs.len() != self.param_types.len() {
            return Err(bad(format!("expected {} inputs, got {}", self.param_types.len(), inputs.len())));
        }
        let fast = match &self.static_shapes {
            Some(shapes) => inputs
                .iter()
                .zip(shapes)
                .zip(&self.param_types)
                .all(|((x, s), t)| x.dtype() == t.dtype && same_shape(x.shape(), s) && x.is_standard_layout()),
            None => false,
        };
        if fast {
            let launch = self.static_launch.as_ref().expect("static shapes come with a plan");
            return Ok(self.launch(inputs, launch, pool, alias));
        }
        for (i, (t, x)) in self.param_types.iter().zip(inputs).enumerate() {
            if !t.accepts(x.dtype(), x.shape()) {
                return Err(bad(format!("input {i}: expected {t}, got {}", TensorType::known(x.dtype(), x.shape()))));
            }
        }
        let standard: SmallVec<[Storage; 4]> = inputs.iter().map(|x| x.to_standard()).collect();
        let refs: SmallVec<[&Storage; 4]> = standard.iter().collect();
        let shapes: SmallVec<[&[usize]; 4]> = refs.iter().map(|x| x.shape()).collect();
        match self.plan(&shapes) {
            Ok(launch) => {
                for (o, shape) in self.an.outputs.iter().zip(&launch.out_shapes) {
                    if tracejit_ir::tensor::check_allocation(o.dtype, shape).is_err() {
                        // Probed again to build the message naming the ops.
                        let op = tracejit_ir::Op::Fused { body: self.body.clone() };
                        tracejit_ir::check_outputs_allocatable(&op, &[], &[TensorType::known(o.dtype, shape)])?;
                    }
                }
                Ok(self.launch(&refs, &launch, pool, None))
            }
            Err(Fallback) => {
                self.interpreted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let owned: Vec<Storage> = inputs.iter().map(|x| (*x).clone()).collect();
                Ok(tracejit_ir::interpret(&self.body, &owned)?.into())
            }
        }
    }

    /// The shape of load `l` given the parameter shapes.
    fn load_shape<'s>(&'s self, l: LoadId, params: &[&'s [usize]]) -> &'s [usize] {
        match &self.an.loads[l].source {
            LoadSource::Param(p) => params[*p],
            LoadSource::Const(c) => c.shape(),
        }
    }

    /// Lays out a call for inputs of these shapes.
    fn plan(&self, params: &[&[usize]]) -> Result<Launch, Fallback> {
        let an = &self.an;
        let rank = an.rank;
        // ---- class sizes ----
        let mut sizes: SmallVec<[usize; 4]> = SmallVec::from_elem(1, rank);
        for c in 0..rank {
            let fixed = an.static_sizes[c];
            let mut s = fixed.unwrap_or(1);
            for src in &an.size_sources[c] {
                let d = params[src.param][src.axis];
                if d == 1 || d == s {
                    continue;
                }
                if s == 1 && fixed != Some(1) {
                    s = d;
                } else {
                    return Err(Fallback);
                }
            }
            sizes[c] = s;
        }
        // A domain whose size overflows cannot be looped over; the
        // interpreter reports the op whose result overflows.
        if tracejit_ir::tensor::element_count(&sizes).is_none() {
            return Err(Fallback);
        }
        // ---- output shapes; each must be what its own operands give ----
        let out_shapes: Vec<SmallVec<[usize; 4]>> =
            an.outputs.iter().map(|o| o.axes.iter().map(|a| a.map_or(1, |c| sizes[c])).collect()).collect();
        // With several outputs, one output's own operands may broadcast to a
        // smaller shape than the domain; the loop nest would write the domain.
        if !self.outputs_fit(&sizes, params) {
            return Err(Fallback);
        }
        if an.has_max_min {
            let reduced = match an.kind {
                KernelKind::Row => (an.split..rank).map(|c| sizes[c]).product::<usize>(),
                _ => (0..an.split).map(|c| sizes[c]).product::<usize>(),
            };
            if reduced == 0 {
                return Err(Fallback);
            }
        }

        // ---- strides per slot and class (elements) ----
        let nl = an.loads.len();
        let mut shapes: Vec<SmallVec<[usize; 4]>> =
            (0..nl).map(|l| self.load_shape(LoadId::new(l), params).iter().copied().collect()).collect();
        let mut strides: Vec<SmallVec<[usize; 4]>> =
            (0..nl).map(|l| class_strides(&an.loads[LoadId::new(l)].axes, &shapes[l], rank)).collect();
        for (o, out) in an.outputs.iter().enumerate() {
            strides.push(class_strides(&out.axes, &out_shapes[o], rank));
        }
        let elem_size: SmallVec<[usize; 8]> =
            an.loads.values().map(|l| l.dtype.size_of()).chain(an.outputs.iter().map(|o| o.dtype.size_of())).collect();
        // Which slots are read/written as vectors along the inner classes.
        let contig: SmallVec<[bool; 8]> =
            an.loads.values().map(|l| l.contig).chain(an.outputs.iter().map(|o| !o.kept)).collect();

        // ---- inner classes ----
        let mut inner_start = match an.kind {
            KernelKind::Elementwise => rank.saturating_sub(1),
            _ => an.split,
        };
        let mut materialize = Vec::new();
        let chain_ok = |st: &[usize], from: usize| -> bool {
            let mut expect = 1;
            for c in (from..rank).rev() {
                if sizes[c] > 1 {
                    if st[c] != expect {
                        return false;
                    }
                    expect *= sizes[c];
                }
            }
            true
        };
        for l in 0..nl {
            if an.loads[LoadId::new(l)].contig && !chain_ok(&strides[l], inner_start) {
                let target: Vec<usize> = an.loads[LoadId::new(l)]
                    .axes
                    .iter()
                    .enumerate()
                    .map(|(a, c)| match c {
                        Some(c) if *c >= inner_start => sizes[*c],
                        _ => shapes[l][a],
                    })
                    .collect();
                shapes[l] = target.iter().copied().collect();
                strides[l] = class_strides(&an.loads[LoadId::new(l)].axes, &shapes[l], rank);
                materialize.push((l, target));
            }
        }
        if an.kind == KernelKind::Elementwise {
            while inner_start > 0 {
                let c = inner_start - 1;
                let ok = sizes[c] == 1
                    || (0..strides.len()).all(|s| {
                        if contig[s] {
                            strides[s][c] == (inner_start..rank).map(|k| sizes[k]).product::<usize>()
                                && chain_ok(&strides[s], inner_start)
                        } else {
                            strides[s][c] == 0
                        }
                    });
                if !ok {
                    break;
                }
                inner_start = c;
            }
        }
        let n: usize = (inner_start..rank).map(|c| sizes[c]).product();
        let outer_range = match an.kind {
            KernelKind::Elementwise => 0..inner_start,
            _ => 0..an.split,
        };
        let count: usize = (0..an.split).map(|c| sizes[c]).product();

        // ---- outer dims, collapsed ----
        let nslots = strides.len();
        let mut dims: Vec<(usize, SmallVec<[isize; 8]>)> = Vec::new();
        for c in outer_range {
            if sizes[c] == 1 {
                continue;
            }
            let st: SmallVec<[isize; 8]> = (0..nslots).map(|s| (strides[s][c] * elem_size[s]) as isize).collect();
            if let Some((psize, pst)) = dims.last_mut() {
                // The previous (outer) dim merges into this one when strides chain.
                if (0..nslots).all(|s| pst[s] == st[s] * sizes[c] as isize) {
                    *psize *= sizes[c];
                    *pst = st;
                    continue;
                }
            }
            dims.push((sizes[c], st));
        }
        let (rows, row_strides) = match dims.pop() {
            Some((size, st)) => (size, st),
            None => (1, SmallVec::from_elem(0, nslots)),
        };
        Ok(Launch { out_shapes, rows, n, count, row_strides, outer: dims, materialize })
    }

    /// True when every output's shape follows from its own inputs.
    fn outputs_fit(&self, sizes: &[usize], params: &[&[usize]]) -> bool {
        // A single output holds every class and reaches every input.
        if self.an.outputs.len() < 2 {
            return true;
        }
        // Cheap sufficient check: every load that holds a class holds it at
        // full size, so every output (which holds every class) sees it.
        self.an.loads.iter().all(|(l, load)| {
            let shape = self.load_shape(l, params);
            load.axes.iter().enumerate().all(|(a, c)| c.is_none_or(|c| shape[a] == sizes[c]))
        })
    }

    /// Allocates the outputs and calls the kernel.
    fn launch(
        &self,
        inputs: &[&Storage],
        l: &Launch,
        pool: &mut BufPool,
        alias: Option<(usize, i64)>,
    ) -> SmallVec<[Storage; 2]> {
        // SAFETY: `launch_with` resolves the pointers as `Calls::run` needs
        // them, which calls the kernel over the whole domain.
        let mut run = |calls: &Calls<'_>, scratch: &mut Vec<u64>| unsafe { calls.run(scratch) };
        // SAFETY: as above.
        unsafe { self.launch_with(inputs, l, pool, alias, &mut run) }
    }

    /// [`CompiledRegion::launch`], the kernel called by `run` on the
    /// resolved calls and the pool's scratch.
    ///
    /// # Safety
    /// `run` calls the kernel over every row of the domain (the outputs
    /// are taken as written), within `Calls::run`'s contract.
    unsafe fn launch_with(
        &self,
        inputs: &[&Storage],
        l: &Launch,
        pool: &mut BufPool,
        alias: Option<(usize, i64)>,
        run: &mut dyn FnMut(&Calls<'_>, &mut Vec<u64>),
    ) -> SmallVec<[Storage; 2]> {
        let an = &self.an;
        let mut held: SmallVec<[Storage; 2]> = SmallVec::new();
        let mut load_ptrs: SmallVec<[i64; 8]> = SmallVec::new();
        for load in an.loads.values() {
            let s = match &load.source {
                LoadSource::Param(p) => inputs[*p],
                LoadSource::Const(c) => c,
            };
            load_ptrs.push(data_ptr(s));
        }
        for (li, target) in &l.materialize {
            let src = match &an.loads[LoadId::new(*li)].source {
                LoadSource::Param(p) => inputs[*p],
                LoadSource::Const(c) => c,
            };
            let m = kernels::broadcast_to(src, target);
            load_ptrs[*li] = data_ptr(&m);
            held.push(m);
        }
        let mut in_place = self.in_place_output(inputs, l, alias);
        let mut outs: SmallVec<[OutBuf; 2]> = an
            .outputs
            .iter()
            .zip(&l.out_shapes)
            .map(|(o, s)| match in_place.take() {
                Some(b) => b,
                None => match pool.take(o.dtype, s) {
                    Some(b) => OutBuf::Reused(b),
                    None => OutBuf::new(o.dtype, s.iter().product()),
                },
            })
            .collect();
        let sch = &self.kernel.schedule;
        // A staged kernel's scratch holds one chunk per staged node.
        let scratch_len = sch.scratch_slots * if sch.chunk > 0 { sch.chunk } else { l.n };
        let mut scratch: Vec<u64> = std::mem::take(&mut pool.scratch);

        let mut base: SmallVec<[i64; 8]> = load_ptrs;
        for o in outs.iter_mut() {
            base.push(o.ptr());
        }
        let calls = Calls {
            code: &self.kernel.code,
            an,
            cost: self.cost,
            rows: l.rows,
            n: l.n,
            count: l.count,
            base: &base,
            row_strides: &l.row_strides,
            outer: &l.outer,
            scratch_len,
        };
        // Every pointer addresses a live buffer (inputs, held
        // materializations, constants, outputs with capacity for their
        // shapes), and the rows/strides/n were derived from those shapes.
        run(&calls, &mut scratch);
        drop(held);
        pool.scratch = scratch;
        outs.into_iter()
            .zip(&l.out_shapes)
            // SAFETY: the kernel writes every element of every output.
            .map(|(o, s)| unsafe { o.finish(s) })
            .collect()
    }
}
