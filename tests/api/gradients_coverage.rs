//! Gradients the op-level tests do not reach: every nn composite against
//! central finite differences (f64) at odd sizes (0, 1, 3, 1023), eagerly
//! and through a Function traced with an unknown batch dim; Functions
//! traced with an unknown batch dim that slice, gather and concatenate
//! along it (batch 0, 1, 3, 7); and a Function that assigns variables
//! while a tape records (gradient through the values read, writes not
//! differentiated, as when the same closure runs eagerly).

use tracejit::prelude::*;

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * y.abs().max(1.0))
}

/// Panics naming the first element where `got` and `want` differ by more
/// than `tol` relative (and their lengths).
fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| (got[i] - want[i]).abs() > tol * want[i].abs().max(1.0)) {
        panic!("{what}: element {i} of {}: autodiff {} vs finite differences {}", got.len(), got[i], want[i]);
    }
}

/// A composite case: a scalar loss of its inputs.
type Loss = fn(&[Tensor]) -> Tensor;

/// `sum(y² / 2 + sin(y))`: a scalar whose cotangent `y + cos(y)` differs
/// from element to element (a uniform one would hide errors, and gives
/// softmax a zero gradient), written without `y`'s shape, which a trace
/// with an unknown batch does not know.
fn weighted(y: &Tensor) -> Tensor {
    (y.square() * 0.5 + y.sin()).sum_all()
}

/// Checks the tape's gradients of `loss` at `inputs` against central
/// differences, eagerly and through a ConcreteFunction traced with the
/// first input's leading dim unknown.
fn check_composite(name: &str, loss: Loss, inputs: &[Tensor]) {
    let tape = GradientTape::persistent();
    for x in inputs {
        tape.watch(x);
    }
    let y = loss(inputs);
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let eager: Vec<Tensor> = tape.gradient(&y, refs.as_slice()).unwrap().into_iter().map(Option::unwrap).collect();
    let f = function(move |xs: Vec<Tensor>| {
        let tape = GradientTape::new();
        for x in &xs {
            tape.watch(x);
        }
        let refs: Vec<&Tensor> = xs.iter().collect();
        let grads = tape.gradient(&loss(&xs), refs.as_slice()).unwrap();
        grads.into_iter().map(Option::unwrap).collect::<Vec<_>>()
    });
    let specs: Vec<TensorSpec> = inputs
        .iter()
        .enumerate()
        .map(|(k, x)| {
            let mut dims: Vec<i64> = x.shape().iter().map(|&d| d as i64).collect();
            if k == 0 && !dims.is_empty() {
                dims[0] = -1;
            }
            TensorSpec::new(x.dtype(), &dims)
        })
        .collect();
    let cf = f.get_concrete_function(specs).unwrap_or_else(|e| panic!("{name}: {e}"));
    let traced = cf.call_flat(inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
    for (k, x) in inputs.iter().enumerate() {
        // A step of 1e-4 keeps the rounding of sums of 1023 terms small
        // against the difference; the truncation error is O(h²).
        let fd = finite_differences(x, 1e-4, &|xk| {
            let mut xs = inputs.to_vec();
            xs[k] = xk.clone();
            vals(&loss(&xs))[0]
        });
        assert_eq!(eager[k].shape(), x.shape(), "{name}: gradient {k}");
        assert_close(&format!("{name}: eager gradient {k}"), &vals(&eager[k]), &fd, 1e-5);
        assert_close(&format!("{name}: traced gradient {k}"), &vals(&traced[k]), &fd, 1e-5);
    }
}

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape, seed).cast(DType::F64)
}

#[test]
fn every_nn_composite_matches_finite_differences() {
    use tracejit::nn;
    for (rows, cols) in [(0usize, 3usize), (1, 1), (3, 5), (1, 1023)] {
        let x = randn(&[rows, cols], 1 + rows as u64);
        let at = |name: &str| format!("{name} [{rows}, {cols}]");
        check_composite(&at("gelu"), |xs| weighted(&nn::gelu(&xs[0])), std::slice::from_ref(&x));
        check_composite(&at("softmax"), |xs| weighted(&nn::softmax(&xs[0], -1)), std::slice::from_ref(&x));
        check_composite(&at("log_softmax"), |xs| weighted(&nn::log_softmax(&xs[0], -1)), std::slice::from_ref(&x));
        let (gamma, beta) = (randn(&[cols], 3) * 0.5 + 1.0, randn(&[cols], 4));
        if cols > 1 {
            // One column has zero variance: layer norm's gradient is then
            // dominated by eps, which finite differences resolve poorly.
            check_composite(
                &at("layer_norm"),
                |xs| weighted(&nn::layer_norm(&xs[0], &xs[1], &xs[2], 1e-5)),
                &[x.clone(), gamma, beta],
            );
        }
        let labels = nn::softmax(&randn(&[rows, cols], 5), -1);
        check_composite(
            &at("softmax_cross_entropy_with_logits"),
            |xs| weighted(&nn::softmax_cross_entropy_with_logits(&xs[0], &xs[1])),
            &[x.clone(), labels],
        );
        if cols <= 5 {
            let (w, b) = (randn(&[cols, 4], 6) * 0.5, randn(&[4], 7));
            for act in [nn::Activation::Linear, nn::Activation::Gelu, nn::Activation::Tanh, nn::Activation::Sigmoid] {
                let loss: Loss = match act {
                    nn::Activation::Linear => |xs| weighted(&nn::dense(&xs[0], &xs[1], &xs[2], nn::Activation::Linear)),
                    nn::Activation::Gelu => |xs| weighted(&nn::dense(&xs[0], &xs[1], &xs[2], nn::Activation::Gelu)),
                    nn::Activation::Tanh => |xs| weighted(&nn::dense(&xs[0], &xs[1], &xs[2], nn::Activation::Tanh)),
                    nn::Activation::Sigmoid => {
                        |xs| weighted(&nn::dense(&xs[0], &xs[1], &xs[2], nn::Activation::Sigmoid))
                    }
                    // relu's kink is where finite differences fail.
                    nn::Activation::Relu => unreachable!("not in the list"),
                };
                check_composite(&at(&format!("dense {act:?}")), loss, &[x.clone(), w.clone(), b.clone()]);
            }
            let hidden = 2;
            let lstm_inputs = [
                x.clone(),
                randn(&[rows, hidden], 8) * 0.5,
                randn(&[rows, hidden], 9) * 0.5,
                randn(&[cols, 4 * hidden], 10) * 0.5,
                randn(&[hidden, 4 * hidden], 11) * 0.5,
                randn(&[4 * hidden], 12) * 0.1,
            ];
            check_composite(
                &at("lstm_cell"),
                |xs| {
                    let (h, c) = nn::lstm_cell(&xs[0], &xs[1], &xs[2], &xs[3], &xs[4], &xs[5]);
                    weighted(&h) + weighted(&(c * 0.5))
                },
                &lstm_inputs,
            );
        }
    }
}

/// The gradient of `sum(tanh(x @ w) * sum(w, axis 0))` with respect to
/// `w`, on a fresh tape.
fn matmul_grad(x: &Tensor, w: &Tensor) -> Tensor {
    let tape = GradientTape::new();
    tape.watch(w);
    let y = (x.matmul(w).tanh() * w.sum(&[0], true)).sum_all();
    tape.gradient(&y, &[w]).unwrap().remove(0).unwrap()
}

#[test]
fn second_order_through_matmul_and_elementwise() {
    // Hessian-vector products: the outer tape's gradient of <dy/dw, v>
    // against central differences of dy/dw along v.
    let x = randn(&[3, 4], 20);
    let w = randn(&[4, 5], 21) * 0.5;
    let v = randn(&[4, 5], 22);
    let outer = GradientTape::new();
    outer.watch(&w);
    let inner = GradientTape::new();
    inner.watch(&w);
    let y = (x.matmul(&w).tanh() * w.sum(&[0], true)).sum_all();
    let g = inner.gradient(&y, &[&w]).unwrap().remove(0).unwrap();
    let hv = outer.gradient(&(&g * &v).sum_all(), &[&w]).unwrap().remove(0).unwrap();
    let h = 1e-5;
    let fd = (matmul_grad(&x, &(&w + &v * h)) - matmul_grad(&x, &(&w - &v * h))) * (0.5 / h);
    assert!(close(&vals(&hv), &vals(&fd), 1e-6), "{:?} vs {:?}", vals(&hv), vals(&fd));
}

/// A loss of `x` ([batch, 5]) and `table` ([6, 5]) that slices, gathers
/// and concatenates along the batch axis.
fn loss(x: &Tensor, table: &Tensor, picks: &Tensor) -> Tensor {
    let shifted = x.slice_axis(0, 1, i64::MAX); // x[1:]
    let head = x.slice_axis(0, 0, -1); // x[:-1]
    let diffs = (&shifted - &head).square(); // [batch - 1, 5]
    let middle = x.slice(&[SliceSpec::FULL, SliceSpec::range(1, 4)]).tanh(); // [batch, 3]
    let rows = table.gather(picks, 0); // [batch, 5]
    let side = Tensor::concat(&[x.clone(), &rows * x], 1); // [batch, 10]
    let stacked = Tensor::concat(&[x.clone(), table.clone()], 0); // [batch + 6, 5]
    diffs.sum_all()
        + middle.sum_all() * 0.3
        + (side.sin() * 0.5).sum_all()
        + rows.square().sum_all()
        + stacked.slice_axis(0, 1, i64::MAX).cos().sum_all()
}

/// Central differences of `f` at `x` with step `h`, one element at a time.
fn finite_differences(x: &Tensor, h: f64, f: &dyn Fn(&Tensor) -> f64) -> Vec<f64> {
    let xs = vals(x);
    let shape = x.shape().to_vec();
    (0..xs.len())
        .map(|i| {
            let at = |d: f64| {
                let mut v = xs.clone();
                v[i] += d;
                f(&Tensor::from_vec(v, &shape))
            };
            (at(h) - at(-h)) / (2.0 * h)
        })
        .collect()
}

#[test]
fn gradients_through_a_function_with_an_unknown_batch_dim() {
    let step = function(|(x, table, picks): (Tensor, Tensor, Tensor)| {
        let tape = GradientTape::new();
        tape.watch(&x);
        tape.watch(&table);
        let y = loss(&x, &table, &picks);
        let g = tape.gradient(&y, &[&x, &table]).unwrap();
        (y, g.into_iter().map(Option::unwrap).collect::<Vec<_>>())
    })
    .input_signature(vec![
        TensorSpec::new(DType::F64, &[-1, 5]),
        TensorSpec::new(DType::F64, &[6, 5]),
        TensorSpec::new(DType::I64, &[-1]),
    ]);
    let table = Tensor::randn(&[6, 5], 2).cast(DType::F64);
    for batch in [0usize, 1, 3, 7] {
        let x = Tensor::randn(&[batch, 5], 10 + batch as u64).cast(DType::F64);
        let picks = Tensor::from_vec((0..batch as i64).map(|i| (i * 4) % 6 - 1).collect::<Vec<_>>(), &[batch]);
        let (y, grads) = step.call((x.clone(), table.clone(), picks.clone())).unwrap();
        assert!(close(&vals(&y), &vals(&loss(&x, &table, &picks)), 1e-12), "batch {batch}: the loss");
        let fd_x = finite_differences(&x, 1e-6, &|x| vals(&loss(x, &table, &picks))[0]);
        let fd_t = finite_differences(&table, 1e-6, &|t| vals(&loss(&x, t, &picks))[0]);
        assert_eq!(grads[0].shape(), x.shape());
        assert_close(&format!("batch {batch}: d/dx"), &vals(&grads[0]), &fd_x, 1e-6);
        assert_close(&format!("batch {batch}: d/dtable"), &vals(&grads[1]), &fd_t, 1e-6);
    }
    assert_eq!(step.tracing_count(), 1, "one trace serves every batch size");
}

#[test]
fn a_slice_the_rules_cannot_place_is_an_error_naming_it() {
    let f = function(|x: Tensor| {
        let tape = GradientTape::new();
        tape.watch(&x);
        // Which elements x[-2:3] reads depends on the unknown length.
        let y = x.slice_axis(0, -2, 3).sum_all();
        // The error panics here, and the call returns it as an Err.
        tape.gradient(&y, &[&x]).unwrap().remove(0).unwrap()
    })
    .input_signature(vec![TensorSpec::new(DType::F64, &[-1])]);
    let e = f.call(Tensor::zeros(&[4], DType::F64)).unwrap_err().to_string();
    assert!(e.contains("slice") && e.contains("negative start"), "{e}");
}

/// The closure the tests below run eagerly and as a Function: it reads
/// `v`, assigns it, reads it again and bumps a counter.
fn stateful(v: &Variable, counter: &Variable, x: &Tensor) -> Tensor {
    let before = v.read();
    counter.assign_add(&Tensor::ones(&[], DType::F64));
    v.assign(&(&before * 2.0 + x));
    let after = v.read();
    v.assign_sub(x);
    let last = v.read();
    (&before * x).sum_all() + (&after * &after).sum_all() + (last * x).sum_all()
}

/// The gradients of `y` with respect to `x` and to `v`.
fn grads(tape: &GradientTape, y: &Tensor, x: &Tensor, v: &Variable) -> Vec<Tensor> {
    let dx = tape.gradient(y, &[x]).unwrap().remove(0).expect("x reaches y");
    let dv = tape.gradient(y, std::slice::from_ref(v)).unwrap().remove(0).expect("v reaches y");
    vec![dx, dv]
}

#[test]
fn a_function_that_assigns_variables_differentiates_through_its_reads() {
    let v = Variable::new(Tensor::from_vec(vec![0.5f64, -1.0, 2.0], &[3])).with_name("state");
    let counter = Variable::new(Tensor::zeros(&[], DType::F64)).with_name("calls").with_trainable(false);
    let x = Tensor::from_vec(vec![1.5f64, 0.25, -0.75], &[3]);
    let start = v.value();

    // Eagerly: the reference.
    let tape = GradientTape::persistent();
    tape.watch(&x);
    let want_y = stateful(&v, &counter, &x);
    let want = grads(&tape, &want_y, &x, &v);
    let want_v = v.value();
    drop(tape);

    // The same closure as a Function called under an eager tape.
    v.assign(&start);
    let (v1, c1) = (v.clone(), counter.clone());
    let f = function(move |x: Tensor| stateful(&v1, &c1, &x)).name("stateful_step");
    let tape = GradientTape::persistent();
    tape.watch(&x);
    let y = f.call(x.clone()).unwrap();
    let got = grads(&tape, &y, &x, &v);
    drop(tape);
    assert!(close(&vals(&y), &vals(&want_y), 1e-12));
    assert!(close(&vals(&v.value()), &vals(&want_v), 1e-12), "the writes happened once");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(close(&vals(g), &vals(w), 1e-12), "gradient {i}: {:?} vs eager {:?}", vals(g), vals(w));
    }
    assert_eq!(vals(&counter.value()), [2.0], "one increment per call");

    // And inside a traced train step.
    v.assign(&start);
    let (f2, v2, x2) = (f.clone(), v.clone(), x.clone());
    let step = function(move |()| {
        let tape = GradientTape::persistent();
        tape.watch(&x2);
        let y = f2.call(x2.clone()).unwrap();
        grads(&tape, &y, &x2, &v2)
    });
    let traced = step.call(()).unwrap();
    for (i, (g, w)) in traced.iter().zip(&want).enumerate() {
        assert!(close(&vals(g), &vals(w), 1e-12), "traced gradient {i}: {:?} vs eager {:?}", vals(g), vals(w));
    }
    assert!(close(&vals(&v.value()), &vals(&want_v), 1e-12));
}
