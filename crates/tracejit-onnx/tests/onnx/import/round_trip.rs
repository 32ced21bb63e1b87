//! Round trips through the exporter: a traced function exported with
//! `to_bytes`, imported back, gives the function's own outputs on random
//! inputs of odd sizes (a symbolic batch dim included), and its Variables
//! come back as the model's, by name and value.

use proptest::prelude::*;
use tracejit_onnx::{import_bytes, to_bytes, Exporter};
use tracejit_trace::{function, DType, Tensor, TensorSpec, Variable};

use super::builder::floats;

fn close(a: &Tensor, b: &Tensor, tol: f32) -> bool {
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    a.len() == b.len()
        && a.iter()
            .zip(&b)
            .all(|(x, y)| x == y || (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol * y.abs().max(1.0))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// A two-layer MLP with softmax, its weights Variables: exported,
    /// imported, run on batches of any size. The same ops run on both sides
    /// (fusion may order a sum differently: a few ulps per dot product of 5).
    #[test]
    fn an_mlp_round_trips(batch in 1usize..7, seed in 0u64..1000) {
        let w1 = Variable::new(Tensor::randn(&[5, 4], seed)).with_name("w1");
        let b1 = Variable::new(Tensor::randn(&[4], seed + 1)).with_name("b1");
        let w2 = Variable::new(Tensor::randn(&[4, 3], seed + 2)).with_name("w2");
        let (a, b, c) = (w1.clone(), b1.clone(), w2.clone());
        let f = function(move |x: Tensor| {
            let h = (x.matmul(&a.read()) + b.read()).tanh();
            tracejit_nn::softmax(&h.matmul(&c.read()), -1)
        });
        let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[-1, 5])).unwrap();
        let bytes = Exporter::new(&cf)
            .variable_names(vec![("w1".to_string(), w1.clone()), ("b1".into(), b1.clone()), ("w2".into(), w2.clone())])
            .to_bytes()
            .unwrap();
        let model = import_bytes(&bytes).unwrap();
        prop_assert_eq!(model.inputs()[0].dims.clone(), vec![None, Some(5)]);
        let mut names: Vec<String> = model.variables().into_iter().map(|(n, _)| n).collect();
        names.sort();
        prop_assert_eq!(names, vec!["b1".to_string(), "w1".into(), "w2".into()]);
        let x = floats(&[batch, 5], seed + 3, false);
        let want = f.call(x.clone()).unwrap();
        let got = model.run(&[x]).unwrap().remove(0);
        prop_assert!(close(&got, &want, 1e-5), "{:?} vs {:?}", got.to_vec::<f32>(), want.to_vec::<f32>());
    }

    /// Elementwise, reductions, shape ops and a select, with NaN and
    /// infinities in the input: the imported model equals the function.
    #[test]
    fn shape_and_elementwise_ops_round_trip(r in 1usize..5, c in 1usize..6, seed in 0u64..1000) {
        let f = function(|x: Tensor| {
            let y = (&x * 0.5).exp().maximum(x.abs()).transpose(&[1, 0]);
            let s = y.sum(&[1], true);
            let z = Tensor::select(&x.t().gt(0.0), &(&y - &s), &y.neg());
            Tensor::concat(&[z.reshape(&[-1]), s.reshape(&[-1])], 0)
        });
        let x = floats(&[r, c], seed, true);
        let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[r as i64, c as i64])).unwrap();
        let model = import_bytes(&to_bytes(&cf).unwrap()).unwrap();
        let want = f.call(x.clone()).unwrap();
        let got = model.run(&[x]).unwrap().remove(0);
        prop_assert!(close(&got, &want, 1e-6), "{:?} vs {:?}", got.to_vec::<f32>(), want.to_vec::<f32>());
    }
}

/// A CNN block (conv, relu, pooling, batch norm in inference) round trips.
#[test]
fn a_cnn_block_round_trips() {
    let w = Variable::new(Tensor::randn(&[4, 2, 3, 3], 5)).with_name("w");
    let gamma = Tensor::randn(&[4], 6);
    let beta = Tensor::randn(&[4], 7);
    let mean = Variable::new(Tensor::randn(&[4], 8) * 0.1);
    let var = Variable::new(Tensor::rand_uniform(&[4], 0.5, 2.0, 9));
    let wc = w.clone();
    let f = function(move |x: Tensor| {
        let y = tracejit_nn::conv2d(&x, &wc.read(), None, tracejit_nn::Conv2dOptions::default().padding(1)).relu();
        let y = tracejit_nn::batch_norm(&y, &gamma, &beta, &mean, &var, 0.9, 1e-5, false);
        tracejit_nn::avg_pool2d(&tracejit_nn::max_pool2d(&y, [2, 2], [2, 2], [0, 0]), [3, 3], [1, 1], [1, 1])
    });
    let x = Tensor::randn(&[2, 2, 7, 9], 10);
    let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[-1, 2, 7, 9])).unwrap();
    let model = import_bytes(&to_bytes(&cf).unwrap()).unwrap();
    let want = f.call(x.clone()).unwrap();
    let got = model.run(&[x]).unwrap().remove(0);
    assert_eq!(got.shape(), want.shape());
    assert!(close(&got, &want, 1e-5), "{:?} vs {:?}", got.to_vec::<f32>(), want.to_vec::<f32>());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// The narrow integers through the exporter and back: a quantization
    /// to u8 (round, clamp, cast), a dequantization of i8, and u8 / i16
    /// arithmetic that wraps; the imported model equals the function bit
    /// for bit, dtypes included.
    #[test]
    fn narrow_integers_round_trip(r in 1usize..5, c in 1usize..7, seed in 0u64..1000) {
        let f = function(|(x, q): (Tensor, Tensor)| {
            let quant = ((&x / 0.05).round() + 100.0).clamp(0.0, 255.0).cast(DType::U8);
            let dequant = (q.cast(DType::F32) - 3.0) * 0.25;
            let wrapped = (&quant + &quant).cast(DType::I16) * q.cast(DType::I16);
            (quant, dequant, wrapped)
        });
        let spec = |d| TensorSpec::new(d, &[r as i64, c as i64]);
        let cf = f.get_concrete_function((spec(DType::F32), spec(DType::I8))).unwrap();
        let model = import_bytes(&to_bytes(&cf).unwrap()).unwrap();
        let x = floats(&[r, c], seed, false) * 4.0;
        let q = (Tensor::randn(&[r, c], seed + 1) * 60.0).cast(DType::I8);
        let want = f.call((x.clone(), q.clone())).unwrap();
        let got = model.run(&[x, q]).unwrap();
        let want = [want.0, want.1, want.2];
        prop_assert_eq!(got.len(), 3);
        for (g, w) in got.iter().zip(&want) {
            prop_assert_eq!(g.dtype(), w.dtype());
            prop_assert!(g.storage().unwrap().bit_eq(w.storage().unwrap()), "{:?} vs {:?}", g, w);
        }
    }
}
