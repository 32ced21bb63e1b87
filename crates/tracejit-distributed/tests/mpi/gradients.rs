//! Gradients through collectives against central finite differences of
//! the world's total loss (the sum of every rank's loss: the objective
//! whose gradient a collective's VJP gives, as in JAX), eagerly and with
//! the tape inside a compiled function.
//!
//! Error analysis: in f64 a central difference with step h has truncation
//! error h²/6·|f'''| (f is tanh-smooth, |f'''| ≤ a few units here) and
//! rounding error about ε·|f|/h; h = 1e-5 gives ≤ 1e-9 of each, so 1e-6
//! absolute plus relative is generous and still catches a wrong factor or
//! sign (which are O(1)).

use tracejit_distributed::{self as distributed, ReduceOp, World};
use tracejit_trace::{function, GradientTape, Tensor};

use crate::values;

pub fn checks() -> Vec<crate::Check> {
    vec![("gradients_match_finite_differences_of_the_total_loss", gradients)]
}

const N: usize = 3;

/// A collective under test: rank `r`'s input to its loss.
type Loss = fn(&Tensor, usize) -> Tensor;

/// `sum(tanh(collective(x ⊙ c_r)) ⊙ d_r)`: per-rank weights so every rank's
/// loss differs.
fn loss_of(coll: impl Fn(&Tensor) -> Tensor, x: &Tensor, rank: usize) -> Tensor {
    let c = Tensor::from_vec(values(rank, 11, N), &[N]);
    let y = coll(&(x * &c)).tanh();
    let d = Tensor::from_vec(values(rank, 12, y.shape().iter().product()), y.shape());
    (&y * &d).sum_all()
}

fn cases() -> Vec<(&'static str, Loss)> {
    vec![
        ("all_reduce(Sum)", |x, r| loss_of(|t| distributed::all_reduce(t, ReduceOp::Sum), x, r)),
        ("all_reduce(Mean)", |x, r| loss_of(|t| distributed::all_reduce(t, ReduceOp::Mean), x, r)),
        ("all_reduce(Max)", |x, r| loss_of(|t| distributed::all_reduce(t, ReduceOp::Max), x, r)),
        ("all_reduce(Min)", |x, r| loss_of(|t| distributed::all_reduce(t, ReduceOp::Min), x, r)),
        ("broadcast(1)", |x, r| loss_of(|t| distributed::broadcast(t, 1), x, r)),
        ("all_gather(0)", |x, r| loss_of(|t| distributed::all_gather(t, 0), x, r)),
    ]
}

/// The world's total loss at this rank's `x`.
fn total(loss: Loss, x: &[f64], rank: usize) -> f64 {
    let l = loss(&Tensor::from_vec(x.to_vec(), &[N]), rank);
    distributed::all_reduce(&l, ReduceOp::Sum).to_vec::<f64>().unwrap()[0]
}

fn gradients(w: World) {
    let x0 = values(w.rank(), 10, N);
    let mut wrong = Vec::new();
    for (name, loss) in cases() {
        // Eagerly.
        let x = Tensor::from_vec(x0.clone(), &[N]);
        let tape = GradientTape::new();
        tape.watch(&x);
        let l = loss(&x, w.rank());
        let eager = tape.gradient(&l, &[&x]).unwrap()[0].clone().unwrap().to_vec::<f64>().unwrap();
        // With the tape inside a compiled function (the backward's
        // collectives are nodes of the same graph).
        let rank = w.rank();
        let f = function(move |x: Tensor| {
            let tape = GradientTape::new();
            tape.watch(&x);
            let l = loss(&x, rank);
            tape.gradient(&l, &[&x]).unwrap()[0].clone().unwrap()
        });
        let compiled = f.call(Tensor::from_vec(x0.clone(), &[N])).unwrap().to_vec::<f64>().unwrap();
        // Finite differences: one rank at a time moves one element. Every
        // rank runs every collective before judging (a rank that stopped
        // early would leave the others' collectives unmatched).
        let h = 1e-5;
        for q in 0..w.size() {
            for j in 0..N {
                let moved = |delta: f64| {
                    let mut x = x0.clone();
                    if q == w.rank() {
                        x[j] += delta;
                    }
                    total(loss, &x, w.rank())
                };
                let fd = (moved(h) - moved(-h)) / (2.0 * h);
                if q == w.rank() {
                    for (how, g) in [("eager", eager[j]), ("compiled", compiled[j])] {
                        if (g - fd).abs() > 1e-6 * (1.0 + fd.abs()) {
                            wrong.push(format!("{name} {how} x[{j}]: {g} vs {fd}"));
                        }
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("; "));
}
