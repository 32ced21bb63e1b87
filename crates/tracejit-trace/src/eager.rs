//! Functions running eagerly: what keeps `run_functions_eagerly(true)` (and
//! the `Eager` retrace policy) from changing a program's meaning.
//!
//! A traced Function memoizes `remember` per Function, and creates the
//! variables of its body once, on the first trace; later calls run the
//! graph and create nothing. Running the closure directly would create a
//! variable on every call and share `remember`ed values between Functions.
//! So a Function that runs eagerly pushes an [`EagerFrame`] for the call:
//! `remember` uses the Function's table, and `Variable::new` in the body
//! returns, from the second call on, the variable the first call created at
//! the same call site (the n-th creation at a site on a call is the n-th of
//! the first call). Error messages say "while running eagerly".

use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;
use tracejit_ir::{eval_primitive, infer, Op, TensorType};
use tracejit_tensor::kernels::par;
use tracejit_tensor::{Storage, UnaryOp};

use crate::context::MemoTable;
use crate::{Tensor, Variable};

/// Where a variable was created: its call site and how many creations came
/// before it at that site during the call.
type Site = (&'static Location<'static>, usize);

/// The variables a Function's body created while running eagerly, by site.
#[derive(Default)]
pub(crate) struct EagerVariables {
    by_site: Mutex<HashMap<Site, Variable>>,
    /// Set once a call has completed: later calls may not create variables.
    complete: AtomicBool,
}

/// One eager call of a Function on this thread.
struct EagerFrame {
    fn_name: Arc<str>,
    memo: Arc<MemoTable>,
    variables: Arc<EagerVariables>,
    /// Creations per call site so far in this call.
    counts: HashMap<&'static Location<'static>, usize>,
    /// The Function was traced before: creating a variable now is what a
    /// later trace would do, an error.
    after_trace: bool,
}

thread_local! {
    static FRAMES: RefCell<Vec<EagerFrame>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` as an eager call of the Function `fn_name` (its `remember`
/// table and variables given; `after_trace`: the Function has traced
/// before, so its body may create no variable); a call that returns marks
/// the variables complete.
pub(crate) fn run_as<T>(
    fn_name: Arc<str>,
    memo: Arc<MemoTable>,
    variables: Arc<EagerVariables>,
    after_trace: bool,
    f: impl FnOnce() -> T,
) -> T {
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            FRAMES.with(|s| s.borrow_mut().pop());
        }
    }
    let frame = EagerFrame { fn_name, memo, variables: variables.clone(), counts: HashMap::new(), after_trace };
    FRAMES.with(|s| s.borrow_mut().push(frame));
    let _pop = Pop;
    let out = f();
    variables.complete.store(true, Ordering::Release);
    out
}

/// The Function running eagerly on this thread (innermost), if any.
pub(crate) fn current_function() -> Option<Arc<str>> {
    FRAMES.with(|s| s.borrow().last().map(|f| f.fn_name.clone()))
}

/// The `remember` table of the innermost Function running eagerly.
pub(crate) fn current_memo() -> Option<Arc<MemoTable>> {
    FRAMES.with(|s| s.borrow().last().map(|f| f.memo.clone()))
}

/// For `Variable::new` at `site` with initial value `initial`: the
/// variable an earlier call of the innermost eager Function created there,
/// or `None` when a new one is to be created (then [`note_created`] records
/// it). Panics when a later call creates a variable the first did not, as
/// a later trace would.
#[track_caller]
pub(crate) fn existing_variable(site: &'static Location<'static>, initial: &Storage) -> Option<Variable> {
    FRAMES.with(|s| {
        let mut frames = s.borrow_mut();
        let frame = frames.last_mut()?;
        let count = frame.counts.entry(site).or_insert(0);
        let key = (site, *count);
        *count += 1;
        let found = frame.variables.by_site.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
        match found {
            Some(v) if v.dtype() == initial.dtype() && v.shape() == initial.shape() => Some(v),
            Some(v) => panic!(
                "Variable::new: function `{}` (running eagerly) creates a {}{:?} variable at {site} where its \
                 first call created a {}{:?} one; a traced function would create it on a later trace, which \
                 is an error. Create it outside the function, or wrap the creation in \
                 `remember(|| Variable::new(...))`",
                frame.fn_name,
                initial.dtype(),
                initial.shape(),
                v.dtype(),
                v.shape()
            ),
            None if frame.after_trace || frame.variables.complete.load(Ordering::Acquire) => panic!(
                "Variable::new: function `{}` (running eagerly) creates a variable at {site} on a later call; \
                 variables may be created only on a function's first call (its first trace). Create it outside \
                 the function, or wrap the creation in `remember(|| Variable::new(...))` so it happens once",
                frame.fn_name
            ),
            None => None,
        }
    })
}

/// Records a variable created at `site` by the innermost eager Function
/// (the site's latest creation, counted by [`existing_variable`]).
pub(crate) fn note_created(site: &'static Location<'static>, v: &Variable) {
    FRAMES.with(|s| {
        if let Some(frame) = s.borrow().last() {
            let n = frame.counts.get(site).copied().unwrap_or(1);
            frame.variables.by_site.lock().unwrap_or_else(|e| e.into_inner()).insert((site, n - 1), v.clone());
        }
    });
}

/// Runs `op` on eager `inputs` at once (the reference kernels): the bottom
/// of the interpreter stack for eager ops (`crate::interpreters`). The
/// sizes are checked first; misuse panics with the op's type error (and,
/// inside a Function running eagerly, its name and the source line).
pub(crate) fn apply_eager(op: Op, inputs: &[&Tensor], location: &'static Location<'static>) -> SmallVec<[Tensor; 1]> {
    let storages: SmallVec<[&Storage; 2]> = inputs.iter().map(|t| t.eager_storage()).collect();
    let types: SmallVec<[TensorType; 2]> = storages.iter().map(|s| TensorType::known(s.dtype(), s.shape())).collect();
    // The sizes are checked here, once, before any kernel runs: by the
    // op's type rule (which the traced path runs too) and for the memory.
    let checked = infer(&op, &types, None).and_then(|outs| {
        // Known inputs give known outputs (an external kernel's declared
        // types may leave dims to it); an unknown one would reach the
        // kernel unchecked.
        let unknown = outs.iter().find(|t| t.dims.iter().any(Option::is_none));
        if let (Some(t), false) = (unknown, matches!(op, Op::Kernel { .. })) {
            let message = format!("the result's shape {t} is not determined by the inputs' {types:?}");
            return Err(tracejit_ir::OpError::new(op.name(), message));
        }
        tracejit_ir::check_outputs_allocatable(&op, &types, &outs)
    });
    if let Err(e) = checked {
        match current_function() {
            Some(f) => panic!("{e} (while running function `{f}` eagerly, at {location})"),
            None => panic!("{e}"),
        }
    }
    // Large results reuse freed heap blocks instead of fresh pages.
    tracejit_jit::tune_malloc();
    // Convolutions and pools take the fast kernels a compiled step runs
    // (the reference loops of `eval_primitive` are the interpreter's and
    // the tests' oracle, 50-150x slower on a CNN layer).
    // f32 exp, tanh and sigmoid take the vector recipes compiled code runs,
    // and f32/f64 products the executor's GEMM (twice the reference's
    // speed) on the thread count, whose bits do not depend on it.
    let outs = match &op {
        Op::Spatial(sp) => tracejit_jit::spatial(sp, &storages),
        Op::MatMul => vec![tracejit_jit::matmul(storages[0], storages[1])],
        _ => match fast_math(&op, &storages) {
            Some(out) => vec![out],
            None => eval_primitive(&op, &storages),
        },
    };
    outs.into_iter().map(Tensor::from_storage).collect()
}

/// An f32 `exp`, `tanh` or `sigmoid` through the vector code compiled
/// steps run (`tracejit_kernels::simd`, 16 or 8 lanes as the entered
/// target allows): the compiled function's bits, within the approximations'
/// documented ULP bounds of the reference (`libm`, which the interpreter
/// keeps as the oracle). GELU's tanh over 1M values took 12 ms in libm's
/// scalar `tanhf`. `None` for any other op or dtype.
fn fast_math(op: &Op, inputs: &[&Storage]) -> Option<Storage> {
    let Op::Unary(u) = op else { return None };
    let apply: fn(&mut [f32], tracejit_kernels::Isa) = match u {
        UnaryOp::Exp => tracejit_kernels::simd::exp_in_place_with,
        UnaryOp::Tanh => tracejit_kernels::simd::tanh_in_place_with,
        UnaryOp::Sigmoid => tracejit_kernels::simd::sigmoid_in_place_with,
        _ => return None,
    };
    let Some(Storage::F32(x)) = inputs.first() else { return None };
    let isa = tracejit_kernels::Isa::current();
    let Some(src) = x.as_slice() else {
        let mut v: Vec<f32> = x.iter().copied().collect();
        apply(&mut v, isa);
        return Storage::from_vec(v, x.shape()).ok();
    };
    // Copied a cache-sized piece at a time and mapped there, so that the
    // input is read once (a copy of all of it first cost as much as the
    // math); large inputs in parts on the pool (an element's bits do not
    // depend on the part it is in).
    const PIECE: usize = 4096;
    let fill = |start: usize, part: &mut [std::mem::MaybeUninit<f32>]| {
        for (out, piece) in part.chunks_mut(PIECE).zip(src[start..].chunks(PIECE)) {
            for (o, &x) in out.iter_mut().zip(piece) {
                o.write(x);
            }
            // SAFETY: every slot of `out` was written just above (a piece
            // and its slots have the same length), and `MaybeUninit<f32>`
            // has `f32`'s layout.
            apply(unsafe { &mut *(out as *mut [std::mem::MaybeUninit<f32>] as *mut [f32]) }, isa);
        }
    };
    // SAFETY: `fill` writes every slot of its part (the pieces cover it).
    let v = unsafe { par::collect(src.len(), PIECE, par::PAR_MIN, &fill) };
    Storage::from_vec(v, x.shape()).ok()
}
