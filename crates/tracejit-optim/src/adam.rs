//! [`Adam`]: adaptive moment estimation, with AdamW-style decoupled weight
//! decay and optional AMSGrad.

use std::sync::Arc;

use tracejit_module::{walk, Module, SlotHolder, Visit, Visitor};
use tracejit_trace::{locked_update, Tensor, Variable};

use crate::optimizer::{
    check_hyperparameter, check_update, new_iterations, slots_for, step_state, trainable_paths, visit_state, Optimizer,
    SlotStore, Slots,
};
use crate::schedule::LearningRate;

/// Adam: with `t` the step (from 1), `m = β1·m + (1-β1)·g`,
/// `v = β2·v + (1-β2)·g²`, `m̂ = m / (1-β1^t)`, `v̂ = v / (1-β2^t)` (AMSGrad:
/// the running maximum of `v` instead), and
/// `w -= lr · (m̂ / (√v̂ + ε) + weight_decay · w)` (decoupled, AdamW).
///
/// A cheap shared handle (clones share the slots) and a `Module`: its
/// moments and step count checkpoint with the model.
///
/// ```
/// use tracejit_optim::{Adam, Optimizer};
/// use tracejit_trace::{value_and_grad, Tensor, Variable};
///
/// let w = Variable::new(Tensor::from_vec(vec![3.0f32, -2.0], &[2]));
/// let opt = Adam::new(0.1).betas(0.9, 0.999).weight_decay(0.0);
/// let vars = vec![w.clone()];
/// for _ in 0..3 {
///     let (_loss, grads) = value_and_grad(&vars, || (w.read() * w.read()).sum_all())?;
///     opt.apply_gradients(&grads, &vars);
/// }
/// // Adam's first steps move each weight by about lr, whatever the gradient's size.
/// let moved = w.value().to_vec::<f32>()?;
/// assert!((moved[0] - 2.7).abs() < 1e-3 && (moved[1] + 1.7).abs() < 1e-3, "{moved:?}");
/// assert_eq!(opt.iterations().value().to_scalar::<i64>()?, 3);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[derive(Clone)]
pub struct Adam {
    inner: Arc<AdamState>,
}

struct AdamState {
    lr: LearningRate,
    beta1: f64,
    beta2: f64,
    epsilon: f64,
    weight_decay: f64,
    amsgrad: bool,
    iterations: Variable,
    slots: SlotStore,
}

impl Adam {
    /// Adam with learning rate `lr` (a number or a [`LearningRate`]
    /// schedule), β = (0.9, 0.999), ε = 1e-8 (PyTorch's default and the
    /// original paper's; Keras uses 1e-7: set it with [`Adam::epsilon`]).
    ///
    /// # Panics
    /// When the learning rate (or a number of its schedule) is NaN,
    /// infinite or negative, naming it (as PyTorch's constructors refuse
    /// them): such a rate would make every weight NaN on the first step.
    #[track_caller]
    pub fn new(lr: impl Into<LearningRate>) -> Adam {
        let lr = lr.into();
        lr.check("Adam");
        Adam {
            inner: Arc::new(AdamState {
                lr,
                beta1: 0.9,
                beta2: 0.999,
                epsilon: 1e-8,
                weight_decay: 0.0,
                amsgrad: false,
                iterations: new_iterations(),
                slots: SlotStore::default(),
            }),
        }
    }

    fn configure(mut self, f: impl FnOnce(&mut AdamState)) -> Adam {
        f(Arc::get_mut(&mut self.inner).expect("configure an optimizer before cloning or using it"));
        self
    }

    /// The moments' decay rates.
    ///
    /// # Panics
    /// Unless both are in [0, 1) (β = 1 divides by `1 - β^t = 0` on the
    /// first step).
    #[track_caller]
    pub fn betas(self, beta1: f64, beta2: f64) -> Adam {
        check_hyperparameter("Adam", "beta1", beta1, 0.0..1.0, "in [0, 1)");
        check_hyperparameter("Adam", "beta2", beta2, 0.0..1.0, "in [0, 1)");
        self.configure(|s| (s.beta1, s.beta2) = (beta1, beta2))
    }

    /// ε, added to `√v̂`.
    ///
    /// # Panics
    /// Unless it is finite and at least 0.
    #[track_caller]
    pub fn epsilon(self, epsilon: f64) -> Adam {
        check_hyperparameter("Adam", "epsilon", epsilon, 0.0.., "finite and at least 0");
        self.configure(|s| s.epsilon = epsilon)
    }

    /// Decoupled weight decay (AdamW).
    ///
    /// # Panics
    /// Unless it is finite and at least 0.
    #[track_caller]
    pub fn weight_decay(self, weight_decay: f64) -> Adam {
        check_hyperparameter("Adam", "weight_decay", weight_decay, 0.0.., "finite and at least 0");
        self.configure(|s| s.weight_decay = weight_decay)
    }

    /// AMSGrad: divide by the running maximum of `v` (a `v_max` slot).
    pub fn amsgrad(self, amsgrad: bool) -> Adam {
        self.configure(|s| s.amsgrad = amsgrad)
    }

    fn slots(&self, vars: &[Variable], paths: impl FnOnce() -> Vec<String>) -> &Slots {
        let names: &[&'static str] = if self.inner.amsgrad { &["m", "v", "v_max"] } else { &["m", "v"] };
        slots_for(&self.inner.slots, "Adam", names, vars, paths)
    }
}

impl Adam {
    fn apply(&self, grads: &[Tensor], vars: &[Variable]) {
        check_update("Adam", grads, vars);
        let slots = self.slots(vars, || vars.iter().map(Variable::name).collect());
        let state = step_state(&self.inner.iterations, vars, Some(slots));
        locked_update(&state, || self.update(grads, vars, slots));
    }

    /// The step itself, run holding the update locks.
    fn update(&self, grads: &[Tensor], vars: &[Variable], slots: &Slots) {
        let s = &self.inner;
        let step = s.iterations.read() + 1i64;
        for (i, (g, v)) in grads.iter().zip(vars).enumerate() {
            let dtype = v.dtype();
            let t = step.cast(dtype);
            let lr = s.lr.at(&(&t - 1.0), dtype);
            let (m, second) = (slots.get(0, i), slots.get(1, i));
            let m_next = m.read() * s.beta1 + g * (1.0 - s.beta1);
            let v_next = second.read() * s.beta2 + g.square() * (1.0 - s.beta2);
            m.assign(&m_next);
            second.assign(&v_next);
            let v_used = if s.amsgrad {
                let v_max = slots.get(2, i);
                let next = v_max.read().maximum(&v_next);
                v_max.assign(&next);
                next
            } else {
                v_next
            };
            let one = |x: f64| Tensor::full(&[], x, dtype);
            let m_hat = m_next / (one(1.0) - one(s.beta1).pow(&t));
            let v_hat = v_used / (one(1.0) - one(s.beta2).pow(&t));
            let mut update = m_hat / (v_hat.sqrt() + s.epsilon);
            let w = v.read();
            if s.weight_decay != 0.0 {
                update = update + &w * s.weight_decay;
            }
            // `assign(w - ..)`, not `assign_sub(..)`: the subtraction joins
            // the update's fused region, whose output is the new value.
            v.assign(&(w - update * lr));
        }
        s.iterations.assign_add(&Tensor::scalar(1i64));
    }
}

impl Optimizer for Adam {
    #[track_caller]
    fn apply_gradients(&self, grads: &[Tensor], vars: &[Variable]) {
        // The update's nodes are the user's `apply_gradients` line.
        tracejit_trace::attributed_to(std::panic::Location::caller(), || self.apply(grads, vars));
    }

    fn build(&self, vars: &[Variable]) {
        self.slots(vars, || vars.iter().map(Variable::name).collect());
    }

    fn build_for(&self, model: &dyn Module) {
        let (vars, paths) = trainable_paths(model);
        self.slots(&vars, || paths);
    }

    fn iterations(&self) -> Variable {
        self.inner.iterations.clone()
    }
}

impl Module for Adam {
    fn type_name(&self) -> &'static str {
        "Adam"
    }

    fn visit_fields<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        visit_state(&self.inner.iterations, self.inner.slots.get(), self, visitor);
    }
}

impl SlotHolder for Adam {
    fn slot_names(&self) -> Vec<&'static str> {
        if self.inner.amsgrad {
            vec!["m", "v", "v_max"]
        } else {
            vec!["m", "v"]
        }
    }

    fn defer_slot(&self, name: &str, owner: &Variable, value: Tensor) {
        self.inner.slots.defer(name, owner, value);
    }
}

impl Visit for Adam {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        walk(self, visitor)
    }
}
