//! Random numbers as graph state (`tracejit::random`): [`Generator`], a
//! counter-based Philox4x32-10 stream (TF's `tf.random.Generator`, JAX's
//! keys) whose key and counter live in a [`Variable`], and the stateless
//! draws [`stateless_normal`] / [`stateless_uniform`], pure functions of an
//! i64 `[2]` seed tensor.
//!
//! A generator's state is an i64 `[3]`: `[counter_lo, counter_hi, key]`.
//! Each draw reads it and advances `counter_hi` by one (one stream per draw,
//! up to 2^64 blocks of four numbers each), so a draw's numbers never
//! depend on its size or on how the work is split: element `i` of a draw
//! is a function of the state it read and of `i` only
//! ([`tracejit_kernels::philox`]). The same seed and sequence of draws give
//! the same bits eagerly, in the interpreter and in the JIT, at any thread
//! count, and after a checkpoint restore (the state is a variable of the
//! module that holds the generator).
//!
//! Inside a traced function a draw is a read of the state, a random node
//! (which passes never fold, merge or move) and an `assign_add` of the
//! advance: a compiled step draws fresh numbers on every call without
//! retracing. The read and the advance are one atomic update (eagerly; in
//! compiled functions under the state's update lock, as optimizer steps),
//! so threads sharing a generator never draw the same numbers.
//!
//! `Tensor::randn(shape, seed)` inside a traced closure is a constant (it
//! runs once, while tracing, like any eager tensor the closure makes): use a
//! `Generator` for numbers that change from call to call.

use tracejit_module::{walk, Module, Segment, Visit, Visitor};
use tracejit_tensor::{DType, RandomDist};
use tracejit_trace::{Tensor, Variable};

/// A counter-based random number generator whose state is a [`Variable`]:
/// a [`Module`] (its state checkpoints with the model that holds it),
/// cheap to clone (clones share the state), `Send + Sync`.
///
/// ```
/// use tracejit_nn::random::Generator;
/// use tracejit_trace::{function, DType, Tensor};
///
/// let g = Generator::from_seed(42);
/// let a = g.normal(&[2, 3], DType::F32);
/// let b = g.normal(&[2, 3], DType::F32);
/// assert_ne!(a.to_vec::<f32>()?, b.to_vec::<f32>()?); // each draw advances the state
///
/// // Compiled: fresh numbers on every call, one trace.
/// let g2 = g.clone();
/// let noisy = function(move |x: Tensor| &x + g2.uniform(&[3], 0.0, 1.0, DType::F32));
/// let x = Tensor::zeros(&[3], DType::F32);
/// let (c, d) = (noisy.call(x.clone())?, noisy.call(x)?);
/// assert_ne!(c.to_vec::<f32>()?, d.to_vec::<f32>()?);
/// assert_eq!(noisy.tracing_count(), 1);
///
/// // The same seed and sequence of draws: the same bits.
/// let again = Generator::from_seed(42);
/// assert_eq!(again.normal(&[2, 3], DType::F32).to_vec::<f32>()?, a.to_vec::<f32>()?);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[derive(Clone)]
pub struct Generator {
    state: Variable,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Generator({})", self.state.name())
    }
}

/// What one draw adds to a state: one to `counter_hi`.
fn advance() -> Tensor {
    Tensor::from_vec(vec![0i64, 1, 0], &[3])
}

impl Generator {
    /// A generator whose key is `seed` and counter 0 (the state
    /// `[0, 0, seed]`; the seed's bits, as i64).
    #[track_caller]
    pub fn from_seed(seed: u64) -> Generator {
        let state = Tensor::from_vec(vec![0i64, 0, seed as i64], &[3]);
        Generator { state: Variable::new(state).with_trainable(false).with_name("generator_state").with_random_state() }
    }

    /// A generator over an existing state variable (an i64 `[3]`).
    ///
    /// # Panics
    /// If the variable is not an i64 `[3]`.
    pub fn from_state(state: Variable) -> Generator {
        assert!(
            state.dtype() == DType::I64 && state.shape() == [3],
            "Generator::from_state: the state must be an i64 [3] (counter low, counter high, key), got {}{:?}",
            state.dtype(),
            state.shape()
        );
        Generator { state: state.with_random_state() }
    }

    /// The state variable: an i64 `[counter_lo, counter_hi, key]`.
    pub fn state(&self) -> &Variable {
        &self.state
    }

    /// The state this draw uses, the generator advanced past it.
    #[track_caller]
    pub(crate) fn next_state(&self) -> Tensor {
        self.state.fetch_add(&advance())
    }

    /// Standard normal samples (`fn normal(&self, shape, dtype)`; f32 or
    /// f64), by Box-Muller on Philox uniforms.
    #[track_caller]
    pub fn normal(&self, shape: &[usize], dtype: DType) -> Tensor {
        let s = self.next_state();
        Tensor::random(RandomDist::Normal { mean: 0.0, stddev: 1.0 }, &s, shape, dtype)
    }

    /// Samples uniform in `[low, high)` (f32 or f64).
    #[track_caller]
    pub fn uniform(&self, shape: &[usize], low: f64, high: f64, dtype: DType) -> Tensor {
        let s = self.next_state();
        Tensor::random(RandomDist::Uniform { low, high }, &s, shape, dtype)
    }

    /// [`Generator::normal`] of `like`'s shape and dtype (dims unknown in a
    /// trace allowed).
    #[track_caller]
    pub fn normal_like(&self, like: &Tensor) -> Tensor {
        let s = self.next_state();
        Tensor::random_like(RandomDist::Normal { mean: 0.0, stddev: 1.0 }, &s, like, like.dtype())
    }

    /// [`Generator::uniform`] of `like`'s shape and dtype.
    #[track_caller]
    pub fn uniform_like(&self, like: &Tensor, low: f64, high: f64) -> Tensor {
        let s = self.next_state();
        Tensor::random_like(RandomDist::Uniform { low, high }, &s, like, like.dtype())
    }

    /// `num_samples` class indices per row of `logits` (`[batch, classes]`
    /// unnormalized log-probabilities, f32 or f64): an i64
    /// `[batch, num_samples]`, each sample drawn with probability
    /// `softmax(logits)` (the Gumbel-max trick: the argmax of the logits
    /// plus Gumbel noise). A class whose logit is `-inf` is never drawn.
    ///
    /// ```
    /// use tracejit_nn::random::Generator;
    /// use tracejit_trace::Tensor;
    ///
    /// let g = Generator::from_seed(7);
    /// let logits = Tensor::from_vec(vec![0.0f32, f32::NEG_INFINITY, 0.0], &[1, 3]);
    /// let s = g.categorical(&logits, 100);
    /// assert_eq!(s.shape(), &[1, 100]);
    /// assert!(s.to_vec::<i64>()?.iter().all(|&c| c == 0 || c == 2));
    /// # Ok::<(), tracejit_trace::Error>(())
    /// ```
    ///
    /// # Panics
    /// If `logits` is not a float tensor of rank 2.
    #[track_caller]
    pub fn categorical(&self, logits: &Tensor, num_samples: usize) -> Tensor {
        let dims = logits.dims();
        assert!(
            dims.len() == 2 && logits.dtype().is_float(),
            "categorical: logits must be a float [batch, classes] tensor, got {}{:?}",
            logits.dtype(),
            dims
        );
        // Each row shifted so its maximum is 0: Gumbel noise (of order 1)
        // added to logits of 1e30 or 3e7 would round away and leave the
        // first maximal class always winning. A row whose maximum is not
        // finite is left as it is (-inf everywhere, +inf or NaN).
        let row_max = logits.max(&[1], true);
        let zero = Tensor::zeros(&[], logits.dtype());
        let logits = logits - Tensor::select(&row_max.is_finite(), &row_max, &zero);
        // u in [0, 1): -ln(-ln u) is Gumbel; u = 0 gives -inf (never the
        // argmax unless every class is -inf).
        let wide = logits.expand_dims(1);
        // [batch, num_samples, classes], the batch possibly unknown.
        let like = &wide + &Tensor::zeros(&[1, num_samples, 1], logits.dtype());
        let u = self.uniform_like(&like, 0.0, 1.0);
        let gumbel = -(-u.log()).log();
        (&wide + &gumbel).argmax(-1, false)
    }
}

impl Module for Generator {
    fn type_name(&self) -> &'static str {
        "Generator"
    }

    fn visit_fields<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        visitor.enter(Segment::Field("state"));
        self.state.visit(visitor);
        visitor.exit(Segment::Field("state"));
    }
}

impl Visit for Generator {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        walk(self, visitor);
    }
}

/// Standard normals that are a pure function of `seed` (an i64 `[2]`
/// tensor, which may be a traced value): the same seed gives the same
/// numbers, eagerly and compiled. Element `i` is that of a generator whose
/// state is `[0, seed[1], seed[0]]`.
///
/// ```
/// use tracejit_trace::{DType, Tensor};
///
/// let seed = Tensor::from_vec(vec![1i64, 2], &[2]);
/// let a = tracejit_nn::random::stateless_normal(&[8], &seed, DType::F32);
/// let b = tracejit_nn::random::stateless_normal(&[8], &seed, DType::F32);
/// assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[track_caller]
pub fn stateless_normal(shape: &[usize], seed: &Tensor, dtype: DType) -> Tensor {
    Tensor::random(RandomDist::Normal { mean: 0.0, stddev: 1.0 }, seed, shape, dtype)
}

/// Samples uniform in `[low, high)`, a pure function of `seed` (an i64
/// `[2]` tensor); see [`stateless_normal`].
#[track_caller]
pub fn stateless_uniform(shape: &[usize], seed: &Tensor, low: f64, high: f64, dtype: DType) -> Tensor {
    Tensor::random(RandomDist::Uniform { low, high }, seed, shape, dtype)
}
