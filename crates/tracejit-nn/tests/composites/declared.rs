//! Every composite declared in `tracejit::nn`, by iterating
//! [`tracejit_nn::declared`]: a new declaration is tested by existing.
//!
//! - its native kernel against its primitive body on its sample inputs,
//!   at every vector width (at least one sample must be one the kernel
//!   accepts, so the comparison cannot pass by skipping);
//! - its backward kernel against the VJP of its primitive body;
//! - its kernel and backward kernel are registered under its name, and a
//!   traced call of it becomes that kernel (the name cannot be misspelled
//!   in one place and not another: it is written once).

use tracejit_ir::Op;
use tracejit_kernels::Isa;
use tracejit_nn::composite;
use tracejit_tensor::Storage;
use tracejit_trace::{function, GradientTape, Tensor, TensorSpec};

fn specs(inputs: &[Tensor]) -> Vec<TensorSpec> {
    inputs.iter().map(|t| TensorSpec { ty: t.tensor_type() }).collect()
}

#[test]
fn every_declared_kernel_matches_its_body() {
    for c in tracejit_nn::declared() {
        let Some(native) = c.native() else { continue };
        let mut accepted = 0;
        for (inputs, attr) in c.examples() {
            if !(native.accepts)(&specs(&inputs)) {
                continue;
            }
            accepted += 1;
            let expected = c.run_body(&inputs, attr);
            let values: Vec<Storage> = inputs.iter().map(|t| t.storage().expect("eager").clone()).collect();
            for isa in [Isa::native(), Isa::native().with_avx512(false)] {
                let got: Vec<Tensor> = (native.run)(&values, isa).into_iter().map(Tensor::from_raw_storage).collect();
                if let Err(d) = composite::compare_outputs(&inputs, &expected, &got) {
                    let shapes: Vec<String> = inputs.iter().map(|t| t.tensor_type().to_string()).collect();
                    panic!("{} ({isa:?}) on ({}): {d}", c.name(), shapes.join(", "));
                }
            }
        }
        assert!(accepted > 0, "{}: no sample is one its kernel accepts", c.name());
    }
}

/// The body's VJP for output cotangents `cts`, by a tape over the body;
/// integer inputs (dropout's random state) have none.
fn body_vjp(c: &tracejit_nn::Composite, inputs: &[Tensor], attr: u32, cts: &[Tensor]) -> Vec<Option<Tensor>> {
    let tape = GradientTape::new();
    let float = |x: &Tensor| x.dtype().is_float();
    for x in inputs.iter().filter(|x| float(x)) {
        tape.watch(x);
    }
    let outs = c.run_body(inputs, attr);
    let total = outs.iter().zip(cts).map(|(y, ct)| (y * ct).sum_all()).reduce(|a, b| a + b).expect("an output");
    let sources: Vec<&Tensor> = inputs.iter().filter(|x| float(x)).collect();
    let mut grads = tape.gradient(&total, &sources).expect("the body is differentiable").into_iter();
    inputs.iter().map(|x| if float(x) { grads.next().flatten() } else { None }).collect()
}

#[test]
fn every_backward_kernel_matches_the_body_vjp() {
    let mut checked = 0;
    for c in tracejit_nn::declared() {
        let Some(backward) = c.backward() else { continue };
        for (i, (inputs, attr)) in c.examples().into_iter().enumerate() {
            let finite = inputs
                .iter()
                .all(|t| t.cast(tracejit_trace::DType::F64).is_finite().to_vec::<bool>().unwrap().iter().all(|b| *b));
            if !finite {
                continue;
            }
            let outputs = c.run_body(&inputs, attr);
            let cts: Vec<Tensor> = outputs
                .iter()
                .enumerate()
                .map(|(k, y)| Tensor::randn(y.shape(), 900 + 10 * i as u64 + k as u64).cast(y.dtype()))
                .collect();
            let want = body_vjp(c, &inputs, attr, &cts);
            let got = backward(&inputs, &outputs, &cts.iter().cloned().map(Some).collect::<Vec<_>>());
            assert_eq!(got.len(), inputs.len(), "{}: one cotangent per input", c.name());
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                // A backward kernel may leave out an input it treats as a
                // constant (layer norm's eps); what it gives must match.
                let Some(g) = g else { continue };
                let w = w.clone().unwrap_or_else(|| Tensor::zeros_like(g));
                if let Err(d) = composite::compare_outputs(&inputs, &[w], std::slice::from_ref(g)) {
                    panic!("{}: the cotangent of input {k} on sample {i}: {d}", c.name());
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 0, "no backward kernel was compared");
}

#[test]
fn declarations_are_registered_and_selected_by_name() {
    let names = composite::registered_kernels();
    for c in tracejit_nn::declared() {
        let Some(native) = c.native() else { continue };
        assert!(names.iter().any(|n| n == c.name()), "{} is not registered: {names:?}", c.name());
        // A traced call the kernel accepts becomes that kernel (or stays
        // the body, for an eager-only kernel).
        let Some((inputs, attr)) = c.examples().into_iter().find(|(x, _)| (native.accepts)(&specs(x))) else {
            panic!("{}: no accepted sample", c.name())
        };
        let f = function(move |xs: Vec<Tensor>| {
            let refs: Vec<&Tensor> = xs.iter().collect();
            c.call(&refs, attr)
        });
        f.call(inputs).unwrap();
        let g = f.concrete_functions()[0].optimized_graph().to_string();
        let kernels: Vec<String> = f.concrete_functions()[0]
            .optimized_graph()
            .nodes()
            .filter_map(|(_, n)| match &n.op {
                Op::Kernel { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect();
        // A composite whose kernel is eager-only is compiled as its body.
        let expected: &[&str] = if c.runs_body_when_traced() { &[] } else { &[c.name()] };
        assert_eq!(kernels, expected, "{}: {g}", c.name());
    }
}
