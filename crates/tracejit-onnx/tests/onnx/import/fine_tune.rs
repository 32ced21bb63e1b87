//! Fine-tuning an imported model (issue 45, item 5): a CNN exported to
//! ONNX, imported, its initializers trained for a few Adam steps under a
//! `GradientTape`, checkpointed, restored into a fresh import, exported
//! again and run in tract, which must give the tuned model's outputs.

use std::collections::BTreeMap;

use tracejit_module::checkpoint;
use tracejit_onnx::{import_bytes, to_bytes};
use tracejit_optim::{Adam, Optimizer};
use tracejit_trace::{function, DType, GradientTape, Tensor, TensorSpec, Variable};

use crate::common::run_tract;

/// `x [N, 2, 6, 6]` -> conv 3x3 (4 filters, pad 1) -> relu -> max pool 2x2
/// -> flatten -> dense to 3: the file another framework would hand over.
fn cnn_file() -> Vec<u8> {
    let w = Variable::new(Tensor::randn(&[4, 2, 3, 3], 31) * 0.3).with_name("conv.w");
    let b = Variable::new(Tensor::zeros(&[4], DType::F32)).with_name("conv.b");
    let d = Variable::new(Tensor::randn(&[36, 3], 32) * 0.2).with_name("dense.w");
    let f = function(move |x: Tensor| {
        let y = tracejit_nn::conv2d(&x, &w.read(), Some(&b.read()), tracejit_nn::Conv2dOptions::default().padding(1));
        let y = tracejit_nn::max_pool2d(&y.relu(), [2, 2], [2, 2], [0, 0]);
        y.reshape(&[-1, 36]).matmul(&d.read())
    });
    let cf = f.get_concrete_function(TensorSpec::new(DType::F32, &[-1, 2, 6, 6])).unwrap();
    to_bytes(&cf).unwrap()
}

fn mse(y: &Tensor, target: &Tensor) -> Tensor {
    let e = y - target;
    (&e * &e).mean_all()
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * y.abs().max(1.0))
}

#[test]
fn an_imported_cnn_fine_tunes_checkpoints_and_exports_with_its_tuned_values() {
    let bytes = cnn_file();
    let model = import_bytes(&bytes).unwrap();
    let vars: Vec<(String, Variable)> = model.variables();
    let names: Vec<&str> = vars.iter().map(|(n, _)| n.as_str()).collect();
    for want in ["conv.w", "conv.b", "dense.w"] {
        assert!(names.contains(&want), "initializer {want} is not a Variable: {names:?}");
    }
    let sources: Vec<Variable> = vars.iter().map(|(_, v)| v.clone()).collect();
    let before: Vec<Vec<f32>> = sources.iter().map(|v| v.value().to_vec::<f32>().unwrap()).collect();

    // A few Adam steps towards fixed targets; the loss must fall.
    let x = Tensor::randn(&[5, 2, 6, 6], 33);
    let target = Tensor::randn(&[5, 3], 34);
    let opt = Adam::new(0.02);
    let mut losses = Vec::new();
    for _ in 0..8 {
        let tape = GradientTape::new();
        let y = model.run(std::slice::from_ref(&x)).unwrap().remove(0);
        let loss = mse(&y, &target);
        let grads = tape.gradient(&loss, &sources).unwrap();
        let grads: Vec<Tensor> =
            grads.into_iter().zip(&names).map(|(g, n)| g.unwrap_or_else(|| panic!("no gradient for {n}"))).collect();
        opt.apply_gradients(&grads, &sources);
        losses.push(loss.to_vec::<f32>().unwrap()[0]);
    }
    assert!(losses[7] < 0.8 * losses[0], "Adam did not lower the loss: {losses:?}");
    for ((n, v), b) in vars.iter().zip(&before) {
        assert_ne!(&v.value().to_vec::<f32>().unwrap(), b, "{n} did not change");
    }
    // The imported model ran compiled code, traced once for this shape.
    let cfs = model.function().concrete_functions();
    assert_eq!(cfs.len(), 1, "the tuned values changed no trace");
    assert_eq!(cfs[0].executor_kind(), "jit", "{:?}", cfs[0].jit_error());
    let tuned = model.run(std::slice::from_ref(&x)).unwrap().remove(0).to_vec::<f32>().unwrap();

    // Checkpoint the tuned initializers; restore them into a fresh import.
    let path = std::env::temp_dir().join(format!("tracejit-fine-tune-{}.safetensors", std::process::id()));
    let values: BTreeMap<String, Tensor> = vars.iter().map(|(n, v)| (n.clone(), v.value())).collect();
    checkpoint::write(&path, &values).unwrap();
    let fresh = import_bytes(&bytes).unwrap();
    let saved = checkpoint::read(&path).unwrap();
    std::fs::remove_file(&path).ok();
    for (n, v) in fresh.variables() {
        v.assign(&saved[&n]);
    }
    let restored = fresh.run(std::slice::from_ref(&x)).unwrap().remove(0).to_vec::<f32>().unwrap();
    assert_eq!(restored, tuned, "the restored model differs from the tuned one");

    // Export the tuned model and run it in tract: its initializers are the
    // tuned values. (Another runtime sums in another order: a few ulps of
    // each 18- and 36-term dot product.)
    let cf = model.concrete_function(&[TensorSpec::new(DType::F32, &[-1, 2, 6, 6])]).unwrap();
    let exported = to_bytes(&cf).unwrap();
    let x_storage = x.storage().unwrap().clone();
    let in_tract = run_tract(&exported, std::slice::from_ref(&x_storage)).unwrap().remove(0);
    let in_tract: Vec<f32> = Tensor::from_raw_storage(in_tract).to_vec::<f32>().unwrap();
    assert!(close(&in_tract, &tuned, 1e-4), "tract {in_tract:?} vs tuned {tuned:?}");
    // And the original file, in tract, does not: the tuning is in the export.
    let original = run_tract(&bytes, &[x_storage]).unwrap().remove(0);
    let original: Vec<f32> = Tensor::from_raw_storage(original).to_vec::<f32>().unwrap();
    assert!(!close(&original, &tuned, 1e-4), "the original model already gave the tuned outputs");
}
