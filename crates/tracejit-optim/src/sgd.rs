//! [`Sgd`]: stochastic gradient descent with optional momentum, Nesterov
//! momentum and (coupled, L2-style) weight decay.

use std::sync::Arc;

use tracejit_module::{walk, Module, SlotHolder, Visit, Visitor};
use tracejit_trace::{locked_update, Tensor, Variable};

use crate::optimizer::{
    check_hyperparameter, check_update, new_iterations, slots_for, step_state, trainable_paths, visit_state, Optimizer,
    SlotStore, Slots,
};
use crate::schedule::LearningRate;

/// SGD: `g += weight_decay · w`; with momentum `velocity = momentum ·
/// velocity + g` and `w -= lr · velocity` (Nesterov: `w -= lr · (g +
/// momentum · velocity)`); without, `w -= lr · g`. Without momentum or
/// weight decay, a compiled step whose gradient is an embedding's (a
/// scatter of rows) updates only the rows it names, in place, with the
/// dense update's bits (see `tracejit_nn::embedding`).
///
/// ```
/// use tracejit_optim::{Optimizer, Sgd};
/// use tracejit_trace::{Tensor, Variable};
///
/// let w = Variable::new(Tensor::from_vec(vec![1.0f32], &[1]));
/// let opt = Sgd::new(0.1).momentum(0.9);
/// let g = Tensor::from_vec(vec![2.0f32], &[1]);
/// opt.apply_gradients(&[g.clone()], &[w.clone()]);   // velocity 2: w = 1 - 0.2
/// opt.apply_gradients(&[g], &[w.clone()]);           // velocity 0.9·2 + 2 = 3.8: w = 0.8 - 0.38
/// assert!((w.value().to_vec::<f32>()?[0] - 0.42).abs() < 1e-6);
/// # Ok::<(), tracejit_trace::Error>(())
/// ```
#[derive(Clone)]
pub struct Sgd {
    inner: Arc<SgdState>,
}

struct SgdState {
    lr: LearningRate,
    momentum: f64,
    nesterov: bool,
    weight_decay: f64,
    iterations: Variable,
    slots: SlotStore,
}

impl Sgd {
    /// Plain SGD with learning rate `lr` (a number or a [`LearningRate`]
    /// schedule).
    ///
    /// # Panics
    /// When the learning rate (or a number of its schedule) is NaN,
    /// infinite or negative, naming it.
    #[track_caller]
    pub fn new(lr: impl Into<LearningRate>) -> Sgd {
        let lr = lr.into();
        lr.check("Sgd");
        Sgd {
            inner: Arc::new(SgdState {
                lr,
                momentum: 0.0,
                nesterov: false,
                weight_decay: 0.0,
                iterations: new_iterations(),
                slots: SlotStore::default(),
            }),
        }
    }

    fn configure(mut self, f: impl FnOnce(&mut SgdState)) -> Sgd {
        f(Arc::get_mut(&mut self.inner).expect("configure an optimizer before cloning or using it"));
        self
    }

    /// Momentum (a `velocity` slot per variable).
    ///
    /// # Panics
    /// Unless it is finite and at least 0.
    #[track_caller]
    pub fn momentum(self, momentum: f64) -> Sgd {
        check_hyperparameter("Sgd", "momentum", momentum, 0.0.., "finite and at least 0");
        self.configure(|s| s.momentum = momentum)
    }

    /// Nesterov momentum (with [`Sgd::momentum`]).
    pub fn nesterov(self, nesterov: bool) -> Sgd {
        self.configure(|s| s.nesterov = nesterov)
    }

    /// Weight decay added to the gradient (`g + weight_decay · w`).
    ///
    /// # Panics
    /// Unless it is finite and at least 0.
    #[track_caller]
    pub fn weight_decay(self, weight_decay: f64) -> Sgd {
        check_hyperparameter("Sgd", "weight_decay", weight_decay, 0.0.., "finite and at least 0");
        self.configure(|s| s.weight_decay = weight_decay)
    }

    fn slots(&self, vars: &[Variable], paths: impl FnOnce() -> Vec<String>) -> Option<&Slots> {
        (self.inner.momentum != 0.0).then(|| slots_for(&self.inner.slots, "Sgd", &["velocity"], vars, paths))
    }
}

impl Sgd {
    fn apply(&self, grads: &[Tensor], vars: &[Variable]) {
        check_update("Sgd", grads, vars);
        let slots = self.slots(vars, || vars.iter().map(Variable::name).collect());
        let state = step_state(&self.inner.iterations, vars, slots);
        locked_update(&state, || self.update(grads, vars, slots));
    }

    /// The step itself, run holding the update locks.
    fn update(&self, grads: &[Tensor], vars: &[Variable], slots: Option<&Slots>) {
        let s = &self.inner;
        let step = s.iterations.read();
        for (i, (g, v)) in grads.iter().zip(vars).enumerate() {
            let lr = s.lr.at(&step.cast(v.dtype()), v.dtype());
            let w = v.read();
            let mut g = g.clone();
            if s.weight_decay != 0.0 {
                g = g + &w * s.weight_decay;
            }
            let update = match slots {
                Some(slots) => {
                    let velocity = slots.get(0, i);
                    let next = velocity.read() * s.momentum + &g;
                    velocity.assign(&next);
                    if s.nesterov {
                        g + next * s.momentum
                    } else {
                        next
                    }
                }
                None => g,
            };
            // `assign(w - ..)`, not `assign_sub(..)`: the subtraction joins
            // the update's fused region, whose output is the new value.
            v.assign(&(w - update * lr));
        }
        s.iterations.assign_add(&Tensor::scalar(1i64));
    }
}

impl Optimizer for Sgd {
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

impl Module for Sgd {
    fn type_name(&self) -> &'static str {
        "Sgd"
    }

    fn visit_fields<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        visit_state(&self.inner.iterations, self.inner.slots.get(), self, visitor);
    }
}

impl SlotHolder for Sgd {
    fn slot_names(&self) -> Vec<&'static str> {
        if self.inner.momentum != 0.0 {
            vec!["velocity"]
        } else {
            vec![]
        }
    }

    fn defer_slot(&self, name: &str, owner: &Variable, value: Tensor) {
        self.inner.slots.defer(name, owner, value);
    }
}

impl Visit for Sgd {
    fn visit<'m>(&'m self, visitor: &mut dyn Visitor<'m>) {
        walk(self, visitor)
    }
}
