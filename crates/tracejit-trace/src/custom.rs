//! [`custom_gradient`]: a function whose gradient is a rule the user writes,
//! in `tf.custom_gradient`'s shape — the closure returns its output and a
//! backward closure from output cotangents to input cotangents.
//!
//! One rule serves three places, so it is kept in a [`Rule`] shared by the
//! returned closure and by every graph that calls it:
//!
//! - **Eagerly** the forward runs at once. Under a tape the output gets a
//!   fresh tape identity and one entry whose backward is the closure the
//!   forward returned, so the tape never looks inside the forward. The
//!   forward's own ops are still recorded, which is what makes the
//!   backward differentiable again (a higher-order gradient reaches the
//!   forward's intermediates that the backward closure captured).
//! - **Inside a trace** the forward is traced into a function of its own
//!   whose `implements` name is reserved for this rule
//!   (`tracejit.custom_gradient.g<id>_<inputs>`; see
//!   [`tracejit_ir::autodiff::is_custom_gradient`]), called by a `Call`
//!   node. The optimizer inlines it like any call. A tape sees the call and
//!   applies the rule, recomputing the forward symbolically to get the
//!   backward closure (its duplicate nodes are merged by CSE).
//! - **Under a tape around a compiled call**, the graph the tape
//!   differentiates keeps that call, and the tape's emitter replays and
//!   differentiates it with the rule (`tape::TensorEmitter`).
//!
//! A rule used inside a trace is registered by name for the life of the
//! process (graphs refer to it by name); rules used only eagerly are not.

use std::collections::HashMap;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use tracejit_ir::autodiff::{self, CUSTOM_GRADIENT_PREFIX};

use crate::tape::TensorEmitter;
use crate::{function, Error, Function, Result, Tensor};

/// The backward closure a forward returns: the cotangent of each output
/// (zeros where the target does not depend on it) to the gradient of each
/// input.
type Backward = Box<dyn Fn(&[Tensor]) -> Vec<Tensor>>;

/// The user's closure, in its general (many inputs, many outputs) form.
type Forward = dyn Fn(&[Tensor]) -> (Vec<Tensor>, Backward) + Send + Sync;

/// The function a rule's forward is traced into, for one number of inputs.
type TracedForward = Function<Vec<Tensor>, Vec<Tensor>>;

/// A registered rule and its number of explicit inputs.
type Registered = (Arc<Rule>, usize);

/// One `custom_gradient`: the forward closure, where it was defined, and the
/// functions its forward was traced into (one per number of inputs).
pub(crate) struct Rule {
    id: u64,
    forward: Box<Forward>,
    defined_at: &'static Location<'static>,
    traced: Mutex<HashMap<usize, TracedForward>>,
}

static NEXT_RULE: AtomicU64 = AtomicU64::new(1);

/// Rules used inside traces, by `implements` name, with their number of
/// inputs.
static RULES: LazyLock<RwLock<HashMap<String, Registered>>> = LazyLock::new(Default::default);

/// The rule a custom-gradient function's `implements` name stands for, and
/// its number of explicit inputs (the call's further inputs are tensors of
/// an enclosing trace the forward captured).
pub(crate) fn lookup(name: &str) -> Option<Registered> {
    if !name.starts_with(CUSTOM_GRADIENT_PREFIX) {
        return None;
    }
    RULES.read().unwrap_or_else(|e| e.into_inner()).get(name).cloned()
}

/// A function with a custom gradient, in `tf.custom_gradient`'s shape: `f`
/// returns its output and a backward closure that maps the output's
/// cotangent `dy` to the input's gradient. The result is a plain
/// `Fn(&Tensor) -> Tensor`, used like any other op: eagerly, under a
/// [`GradientTape`](crate::GradientTape) or
/// [`value_and_grad`](crate::value_and_grad), and inside a
/// [`function`](crate::function) (with the tape inside the function or
/// around its call). The backward is itself differentiated (higher-order
/// gradients) when a tape records it: write it in tensor ops, and let it
/// capture the forward's intermediates rather than recompute them.
///
/// A clipped gradient leaves values alone and clips what flows back:
///
/// ```
/// use tracejit_trace::{custom_gradient, GradientTape, Tensor};
///
/// let clip = custom_gradient(|x: &Tensor| (x.clone(), |dy: &Tensor| dy.clamp(-1.0, 1.0)));
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
/// let tape = GradientTape::new();
/// tape.watch(&x);
/// let y = (clip(&x) * 10.0).sum_all();
/// let g = tape.gradient(&y, &[&x])?;
/// assert_eq!(g[0].as_ref().unwrap().to_vec::<f32>()?, [1.0, 1.0]);   // 10 clipped to 1
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
///
/// A numerically stable `log(1 + e^x)`: the plain formula's gradient
/// `e^x / (1 + e^x)` is `inf / inf = NaN` for large `x`; the rule reuses the
/// forward's `e^x` and is written so that it stays finite:
///
/// ```
/// use tracejit_trace::{custom_gradient, GradientTape, Tensor};
///
/// let log1pexp = custom_gradient(|x: &Tensor| {
///     let e = x.exp();
///     let y = (&e + 1.0).log();
///     (y, move |dy: &Tensor| dy * (1.0 - 1.0 / (&e + 1.0)))
/// });
/// let x = Tensor::from_vec(vec![0.0f64, 100.0, 1000.0], &[3]);
/// let tape = GradientTape::new();
/// tape.watch(&x);
/// let y = log1pexp(&x);
/// let g = tape.gradient(&y, &[&x])?;
/// assert_eq!(g[0].as_ref().unwrap().to_vec::<f64>()?, [0.5, 1.0, 1.0]);   // no NaN at 1000
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
///
/// Inside a traced function it is one graph, forward and backward:
///
/// ```
/// use tracejit_trace::{custom_gradient, function, GradientTape, Tensor};
///
/// let clip = custom_gradient(|x: &Tensor| (x.clone(), |dy: &Tensor| dy.clamp(-1.0, 1.0)));
/// let grad = function(move |x: Tensor| {
///     let tape = GradientTape::new();
///     tape.watch(&x);
///     let y = (clip(&x) * -5.0).sum_all();
///     tape.gradient(&y, &[&x]).unwrap().remove(0).unwrap()
/// });
/// assert_eq!(grad.call(Tensor::from_vec(vec![3.0f32], &[1]))?.to_vec::<f32>()?, [-1.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
///
/// `f` must be `Send + Sync + 'static` (like [`function`]'s closure) so
/// that the result can be used inside functions, which run on any thread;
/// the backward closure only needs `'static` (it runs on the thread that
/// computes the gradient). Variables read inside `f` get no gradient
/// through it: pass their values in as inputs ([`custom_gradient_n`])
/// to give them one. A custom gradient inside a `cond` branch or a loop
/// body is differentiated by a tape inside that branch or body; a tape
/// around the whole conditional refuses it by name rather than
/// differentiate its forward.
#[track_caller]
pub fn custom_gradient<F, G>(f: F) -> impl Fn(&Tensor) -> Tensor + Clone + Send + Sync + 'static
where
    F: Fn(&Tensor) -> (Tensor, G) + Send + Sync + 'static,
    G: Fn(&Tensor) -> Tensor + 'static,
{
    let forward = move |xs: &[Tensor]| -> (Vec<Tensor>, Backward) {
        let (y, g) = f(&xs[0]);
        (vec![y], Box::new(move |dys: &[Tensor]| vec![g(&dys[0])]))
    };
    let rule = Rule::new(Box::new(forward), Location::caller());
    move |x: &Tensor| rule.apply(std::slice::from_ref(x)).remove(0)
}

/// [`custom_gradient`] for several inputs and outputs, as JAX's
/// `custom_vjp` and TensorFlow's `custom_gradient` take them: `f` maps the
/// inputs to the outputs and a backward closure; the backward maps one
/// cotangent per output (zeros for an output the target does not use) to
/// one gradient per input, each of its input's dtype and shape.
///
/// ```
/// use tracejit_trace::{custom_gradient_n, GradientTape, Tensor};
///
/// // x * y, whose gradient pretends y is a constant (a stop-gradient on y).
/// let scale = custom_gradient_n(|xs: &[Tensor]| {
///     let (x, y) = (xs[0].clone(), xs[1].clone());
///     let out = vec![&x * &y];
///     (out, move |dys: &[Tensor]| vec![&dys[0] * &y, Tensor::zeros_like(&y)])
/// });
/// let (x, y) = (Tensor::from_vec(vec![2.0f32], &[1]), Tensor::from_vec(vec![3.0f32], &[1]));
/// let tape = GradientTape::new();
/// tape.watch(&x);
/// tape.watch(&y);
/// let z = scale(&[x.clone(), y.clone()]).remove(0);
/// let g = tape.gradient(&z, &[&x, &y])?;
/// assert_eq!(g[0].as_ref().unwrap().to_vec::<f32>()?, [3.0]);
/// assert_eq!(g[1].as_ref().unwrap().to_vec::<f32>()?, [0.0]);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[track_caller]
pub fn custom_gradient_n<F, G>(f: F) -> impl Fn(&[Tensor]) -> Vec<Tensor> + Clone + Send + Sync + 'static
where
    F: Fn(&[Tensor]) -> (Vec<Tensor>, G) + Send + Sync + 'static,
    G: Fn(&[Tensor]) -> Vec<Tensor> + 'static,
{
    let forward = move |xs: &[Tensor]| -> (Vec<Tensor>, Backward) {
        let (ys, g) = f(xs);
        (ys, Box::new(g))
    };
    let rule = Rule::new(Box::new(forward), Location::caller());
    move |xs: &[Tensor]| rule.apply(xs)
}

impl Rule {
    fn new(forward: Box<Forward>, defined_at: &'static Location<'static>) -> Arc<Rule> {
        Arc::new(Rule {
            id: NEXT_RULE.fetch_add(1, Ordering::Relaxed),
            forward,
            defined_at,
            traced: Mutex::new(HashMap::new()),
        })
    }

    /// "custom_gradient (defined at file:line)", for errors.
    fn label(&self) -> String {
        format!("custom_gradient (defined at {}:{})", self.defined_at.file(), self.defined_at.line())
    }

    /// Applies the rule to `xs`: traced when one of them is symbolic,
    /// else eagerly. Panics (as ops do) when tracing the forward fails.
    fn apply(self: &Arc<Rule>, xs: &[Tensor]) -> Vec<Tensor> {
        if xs.iter().any(Tensor::is_symbolic) {
            match self.traced_function(xs.len()).call(xs.to_vec()) {
                Ok(ys) => return ys,
                Err(e) => panic!("{}: {e}", self.label()),
            }
        }
        let (ys, backward) = (self.forward)(xs);
        if !crate::tape::recording() {
            return ys;
        }
        // Fresh identities: the tape reaches the inputs through the rule
        // only, never through the forward's ops (`x.clone()` would even be
        // the input itself).
        let outs: Vec<Tensor> = ys.iter().map(Tensor::with_new_id).collect();
        let rule = self.clone();
        let arity = xs.len();
        let vjp = move |ins: &[Tensor], outs: &[Tensor], cts: &[Option<Tensor>]| {
            rule.cotangents(&backward, arity, ins, outs, cts)
        };
        let inputs: Vec<&Tensor> = xs.iter().collect();
        crate::tape::record_closure(std::rc::Rc::new(vjp), &inputs, &outs, self.defined_at);
        outs
    }

    /// The function the forward is traced into for `arity` inputs, named
    /// and registered on first use.
    fn traced_function(self: &Arc<Rule>, arity: usize) -> TracedForward {
        let mut traced = self.traced.lock().unwrap_or_else(|e| e.into_inner());
        traced
            .entry(arity)
            .or_insert_with(|| {
                let name = format!("{CUSTOM_GRADIENT_PREFIX}g{}_{arity}", self.id);
                RULES.write().unwrap_or_else(|e| e.into_inner()).insert(name.clone(), (self.clone(), arity));
                let rule = self.clone();
                // Only ever called from inside a trace, where the caller's
                // graph inlines it: compiling it alone would be wasted.
                function(move |xs: Vec<Tensor>| (rule.forward)(&xs).0)
                    .name(format!("custom_gradient@{}:{}", self.defined_at.file(), self.defined_at.line()))
                    .implements(&name)
                    .jit(false)
            })
            .clone()
    }

    /// The outputs of the forward on a call's explicit inputs (the first
    /// `arity`; a replayed call under a tape).
    pub(crate) fn forward_outputs(&self, arity: usize, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.check_inputs(arity, inputs)?;
        Ok((self.forward)(&inputs[..arity]).0)
    }

    /// The input cotangents of a call recorded inside a trace: the forward
    /// runs again on the same (symbolic) inputs for its backward closure.
    pub(crate) fn recomputed_cotangents(
        &self,
        arity: usize,
        inputs: &[Tensor],
        outputs: &[Tensor],
        cts: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        self.check_inputs(arity, inputs)?;
        let (_, backward) = (self.forward)(&inputs[..arity]);
        self.cotangents(&backward, arity, inputs, outputs, cts)
    }

    fn check_inputs(&self, arity: usize, inputs: &[Tensor]) -> Result<()> {
        if inputs.len() < arity {
            return Err(self.error(format!("the call has {} inputs, the rule {arity}", inputs.len())));
        }
        Ok(())
    }

    /// Runs `backward` on the output cotangents (zeros for `None`) and
    /// checks that it returned one gradient per explicit input, of the
    /// input's dtype and shape. Integer and bool inputs get `None`, as do
    /// the tensors of an enclosing trace the forward captured.
    fn cotangents(
        &self,
        backward: &Backward,
        arity: usize,
        inputs: &[Tensor],
        outputs: &[Tensor],
        cts: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        let mut e = TensorEmitter;
        let mut dys = Vec::with_capacity(outputs.len());
        for (o, ct) in outputs.iter().zip(cts) {
            dys.push(match ct {
                Some(ct) => ct.clone(),
                None => autodiff::zeros_like(&mut e, o.clone()).map_err(|err| self.error(err.to_string()))?,
            });
        }
        let grads = backward(&dys);
        if grads.len() != arity {
            return Err(self.error(format!(
                "the backward returned {} gradient(s) for {arity} input(s); return one per input",
                grads.len()
            )));
        }
        let mut out = Vec::with_capacity(inputs.len());
        for (i, (g, x)) in grads.into_iter().zip(inputs).enumerate() {
            if !x.dtype().is_float() {
                out.push(None);
                continue;
            }
            let (gt, xt) = (g.tensor_type(), x.tensor_type());
            // Dims unknown in the trace are taken to agree.
            let dims_differ = gt.rank() != xt.rank()
                || gt.dims.iter().zip(&xt.dims).any(|(a, b)| matches!((a, b), (Some(a), Some(b)) if a != b));
            if gt.dtype != xt.dtype || dims_differ {
                return Err(self.error(format!(
                    "the backward's gradient {i} is {gt}, but input {i} is {xt}; return one gradient of each \
                     input's dtype and shape"
                )));
            }
            out.push(Some(g));
        }
        out.resize(inputs.len(), None);
        Ok(out)
    }

    fn error(&self, message: String) -> Error {
        Error::Gradient { message: format!("{}: {message}", self.label()) }
    }
}
