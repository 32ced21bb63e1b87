//! What [`GradientTape::gradient`] differentiates with respect to: tensors
//! (watched or computed while the tape recorded) or variables (every read
//! of them while it recorded), by value, by reference, in slices, arrays
//! or `Vec`s.

use super::{grad_error, GradientTape};
use crate::error::Result;
use crate::tensor::Tensor;
use crate::variable::Variable;

/// What [`GradientTape::gradient`] differentiates with respect to:
/// tensors or variables.
pub trait Source {
    /// For each source, the recorded tensors whose cotangents sum to its
    /// gradient.
    #[doc(hidden)]
    fn source_tensors(&self, tape: &GradientTape) -> Result<Vec<Vec<Tensor>>>;
}

fn check_float(t: &Tensor, what: &str) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(grad_error(format!("{what} is {} and has no gradient; only float sources are differentiable", t.dtype())))
    }
}

impl Source for [&Tensor] {
    fn source_tensors(&self, _: &GradientTape) -> Result<Vec<Vec<Tensor>>> {
        self.iter()
            .enumerate()
            .map(|(i, t)| check_float(t, &format!("source {i}")).map(|_| vec![(*t).clone()]))
            .collect()
    }
}

impl<const N: usize> Source for [&Tensor; N] {
    fn source_tensors(&self, tape: &GradientTape) -> Result<Vec<Vec<Tensor>>> {
        self.as_slice().source_tensors(tape)
    }
}

impl Source for [Tensor] {
    fn source_tensors(&self, tape: &GradientTape) -> Result<Vec<Vec<Tensor>>> {
        let refs: Vec<&Tensor> = self.iter().collect();
        refs.as_slice().source_tensors(tape)
    }
}

impl<const N: usize> Source for [Tensor; N] {
    fn source_tensors(&self, tape: &GradientTape) -> Result<Vec<Vec<Tensor>>> {
        self.as_slice().source_tensors(tape)
    }
}

impl Source for Vec<Tensor> {
    fn source_tensors(&self, tape: &GradientTape) -> Result<Vec<Vec<Tensor>>> {
        self.as_slice().source_tensors(tape)
    }
}

/// The recorded reads of each variable: the one rule for variables
/// given by value or by reference.
fn variable_sources<'a>(tape: &GradientTape, vars: impl Iterator<Item = &'a Variable>) -> Result<Vec<Vec<Tensor>>> {
    let st = tape.state.borrow();
    vars.map(|v| {
        if !v.dtype().is_float() {
            return Err(grad_error(format!(
                "variable `{}` is {} and has no gradient; only float sources are differentiable",
                v.name(),
                v.dtype()
            )));
        }
        Ok(st.reads.get(&v.id()).cloned().unwrap_or_default())
    })
    .collect()
}

impl Source for [Variable] {
    fn source_tensors(&self, tape: &GradientTape) -> Result<Vec<Vec<Tensor>>> {
        variable_sources(tape, self.iter())
    }
}

impl<const N: usize> Source for [Variable; N] {
    fn source_tensors(&self, tape: &GradientTape) -> Result<Vec<Vec<Tensor>>> {
        self.as_slice().source_tensors(tape)
    }
}

impl Source for Vec<Variable> {
    fn source_tensors(&self, tape: &GradientTape) -> Result<Vec<Vec<Tensor>>> {
        self.as_slice().source_tensors(tape)
    }
}

impl Source for Vec<&Tensor> {
    fn source_tensors(&self, tape: &GradientTape) -> Result<Vec<Vec<Tensor>>> {
        self.as_slice().source_tensors(tape)
    }
}

impl Source for [&Variable] {
    fn source_tensors(&self, tape: &GradientTape) -> Result<Vec<Vec<Tensor>>> {
        variable_sources(tape, self.iter().copied())
    }
}

impl<const N: usize> Source for [&Variable; N] {
    fn source_tensors(&self, tape: &GradientTape) -> Result<Vec<Vec<Tensor>>> {
        self.as_slice().source_tensors(tape)
    }
}

impl Source for Vec<&Variable> {
    fn source_tensors(&self, tape: &GradientTape) -> Result<Vec<Vec<Tensor>>> {
        self.as_slice().source_tensors(tape)
    }
}
