//! [`LearningRate`]: a constant or a schedule of the step count. A schedule
//! is computed with tensor ops from the optimizer's `iterations` variable,
//! so inside a traced training step it is part of the graph and changes
//! every step without retracing.

use tracejit_tensor::DType;
use tracejit_trace::Tensor;

/// A learning rate: constant, or a function of the step `t` (0 on the first
/// update), as Keras defines them.
#[derive(Clone, Debug, PartialEq)]
pub enum LearningRate {
    /// The same rate every step.
    Constant(f64),
    /// `initial · rate^(t / steps)` (`staircase`: `floor(t / steps)`).
    ExponentialDecay {
        /// The rate at step 0.
        initial: f64,
        /// The factor per `steps` steps.
        rate: f64,
        /// The steps over which the rate is applied once.
        steps: f64,
        /// Decay in whole intervals.
        staircase: bool,
    },
    /// `initial · ((1 - alpha) · ½(1 + cos(π · min(t, steps) / steps)) + alpha)`.
    CosineDecay {
        /// The rate at step 0.
        initial: f64,
        /// The steps to decay over.
        steps: f64,
        /// The final rate as a fraction of `initial`.
        alpha: f64,
    },
    /// A linear warm-up over `steps` steps to `then`'s first rate
    /// (`then(0) · (t + 1) / steps`), then `then(t - steps)`.
    Warmup {
        /// The warm-up's length.
        steps: f64,
        /// The schedule after it.
        then: Box<LearningRate>,
    },
}

impl LearningRate {
    /// Panics, naming `optimizer` and the parameter, unless every number of
    /// the schedule is finite and in range: rates at least 0, step counts
    /// above 0, `alpha` in [0, 1].
    #[track_caller]
    pub(crate) fn check(&self, optimizer: &str) {
        use crate::optimizer::check_hyperparameter as check;
        let at_least_0 = "finite and at least 0";
        match self {
            LearningRate::Constant(lr) => check(optimizer, "the learning rate", *lr, 0.0.., at_least_0),
            LearningRate::ExponentialDecay { initial, rate, steps, staircase: _ } => {
                check(optimizer, "ExponentialDecay's initial rate", *initial, 0.0.., at_least_0);
                check(optimizer, "ExponentialDecay's rate", *rate, 0.0.., at_least_0);
                check(optimizer, "ExponentialDecay's steps", *steps, f64::MIN_POSITIVE.., "finite and above 0");
            }
            LearningRate::CosineDecay { initial, steps, alpha } => {
                check(optimizer, "CosineDecay's initial rate", *initial, 0.0.., at_least_0);
                check(optimizer, "CosineDecay's steps", *steps, f64::MIN_POSITIVE.., "finite and above 0");
                check(optimizer, "CosineDecay's alpha", *alpha, 0.0..=1.0, "in [0, 1]");
            }
            LearningRate::Warmup { steps, then } => {
                check(optimizer, "Warmup's steps", *steps, f64::MIN_POSITIVE.., "finite and above 0");
                then.check(optimizer);
            }
        }
    }
}

impl From<f64> for LearningRate {
    fn from(v: f64) -> LearningRate {
        LearningRate::Constant(v)
    }
}

impl LearningRate {
    /// The rate at step `t` (a scalar tensor of `dtype`, a float).
    pub fn at(&self, t: &Tensor, dtype: DType) -> Tensor {
        let k = |v: f64| Tensor::full(&[], v, dtype);
        match self {
            LearningRate::Constant(v) => k(*v),
            LearningRate::ExponentialDecay { initial, rate, steps, staircase } => {
                let mut p = t / *steps;
                if *staircase {
                    p = p.floor();
                }
                k(*rate).pow(&p) * *initial
            }
            LearningRate::CosineDecay { initial, steps, alpha } => {
                let frac = t.minimum(*steps) / *steps;
                let cos = ((frac * std::f64::consts::PI).cos() + 1.0) * 0.5;
                (cos * (1.0 - alpha) + *alpha) * *initial
            }
            LearningRate::Warmup { steps, then } => {
                let warm = then.at(&k(0.0), dtype) * ((t + 1.0) / *steps);
                let after = then.at(&(t - *steps), dtype);
                Tensor::select(&t.lt(*steps), &warm, &after)
            }
        }
    }
}
