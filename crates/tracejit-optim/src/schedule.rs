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
