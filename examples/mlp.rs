//! A small MLP as a `#[derive(Module)]`: a compiled forward pass, its
//! summary and variable paths, and a checkpoint saved, perturbed away and
//! restored (the output is the same again).
//!
//! Run with `cargo run --example mlp`.

use tracejit::checkpoint;
use tracejit::prelude::*;

/// `y = x @ w + b`.
#[derive(Module, Clone)]
struct Dense {
    w: Variable,
    b: Variable,
}

impl Dense {
    fn new(inputs: usize, outputs: usize, seed: u64) -> Dense {
        let scale = 1.0 / (inputs as f64).sqrt();
        Dense {
            w: Variable::new(Tensor::randn(&[inputs, outputs], seed) * scale),
            b: Variable::new(Tensor::zeros(&[outputs], DType::F32)),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.matmul(&self.w.read()) + self.b.read()
    }
}

/// The nonlinearity between layers: configuration, not state.
#[derive(Clone, Copy, Debug)]
enum Activation {
    Relu,
    Tanh,
}

impl Activation {
    fn apply(self, x: Tensor) -> Tensor {
        match self {
            Activation::Relu => x.relu(),
            Activation::Tanh => x.tanh(),
        }
    }
}

/// Dense layers with an activation after every layer but the last.
#[derive(Module, Clone)]
struct Mlp {
    layers: Vec<Dense>,
    #[module(skip)]
    act: Activation,
}

impl Mlp {
    fn new(sizes: &[usize], act: Activation) -> Mlp {
        let layers = sizes.windows(2).enumerate().map(|(i, io)| Dense::new(io[0], io[1], 100 + i as u64)).collect();
        Mlp { layers, act }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let mut h = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h);
            if i + 1 < self.layers.len() {
                h = self.act.apply(h);
            }
        }
        h
    }
}

#[path = "common/logging.rs"]
mod logging;

fn main() -> anyhow::Result<()> {
    logging::init();
    let mlp = Mlp::new(
        &[8, 16, 16, 4],
        if std::env::args().any(|a| a == "--tanh") { Activation::Tanh } else { Activation::Relu },
    );
    mlp.assign_names();
    println!("{:?} MLP, {} layers\n", mlp.act, mlp.layers.len());
    println!("{}\n", mlp.summary());
    for (path, v) in mlp.named_variables() {
        println!("{path:<14} {:<16} {}{:?}", v.name(), v.dtype(), v.shape());
    }

    // The compiled forward pass captures the variables by reference (a clone
    // of the module shares them), so it sees every later assignment.
    let model = mlp.clone();
    let forward = function(move |x: Tensor| model.forward(&x)).name("mlp_forward");
    let x = Tensor::randn(&[3, 8], 7);
    let before = forward.call(x.clone())?;
    let eager = mlp.forward(&x);
    let gap =
        before.to_vec::<f32>()?.iter().zip(eager.to_vec::<f32>()?).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    assert!(gap < 1e-4, "compiled and eager agree (gap {gap})");
    println!("\noutput:   {:?}", before.to_vec::<f32>()?);

    let dir = std::env::temp_dir().join(format!("tracejit-mlp-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("mlp.safetensors");
    checkpoint::save(&mlp, &path)?;
    println!("saved {} ({} bytes)", path.display(), std::fs::metadata(&path)?.len());

    for v in mlp.variables() {
        v.assign_add(&Tensor::full(v.shape(), 0.5, v.dtype()));
    }
    let perturbed = forward.call(x.clone())?;
    println!("perturbed: {:?}", perturbed.to_vec::<f32>()?);
    assert_ne!(perturbed.to_vec::<f32>()?, before.to_vec::<f32>()?);

    checkpoint::restore(&mlp, &path)?;
    let after = forward.call(x)?;
    println!("restored: {:?}", after.to_vec::<f32>()?);
    assert_eq!(after.to_vec::<f32>()?, before.to_vec::<f32>()?, "the restored model computes the same output");
    println!("traced {} time(s)", forward.tracing_count());

    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
