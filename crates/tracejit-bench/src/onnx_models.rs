//! W14 `resnet50`, W14b `resnet50_b8` and W15 `minilm_onnx`: real model
//! files through the ONNX importer, as ONNX Runtime runs them in
//! `bench_peers.py --system onnxruntime`.
//!
//! The files are `shared/peers/models/make_models.py`'s, in
//! `$TRACEJIT_PEERS_MODELS` or `~/.cache/tracejit-peers/models`:
//! `resnet50.onnx` (onnx 1.22.0's `light_resnet50` with seeded weights, the
//! same bytes `scripts/make_light_models.py` writes) and `minilm.onnx`
//! (all-MiniLM-L6-v2 exported by PyTorch, mean pooling and normalization in
//! the graph). A missing file makes the rows `n/a`, naming the file and the
//! command that makes it.
//!
//! Inputs are `bench_peers.py`'s: W14 `gen(110, [1, 3, 224, 224], -1, 1)`,
//! W14b the same at batch 8 (its image 0 is W14's), W15 `w15_inputs` (ids
//! and mask `[32, 128]`, every padded position computed, as ONNX Runtime
//! does). The closure is [`tracejit::onnx::Model::evaluate`]: the graph's
//! ops on the harness's tensors, so eager runs them op by op and the
//! traced modes trace the graph like any closure. The import itself
//! happens when the inputs are built (not timed; `import_ms` measures it).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use tracejit::onnx::Model;
use tracejit::Tensor;

use crate::transformer::gen;
use crate::verify::Tolerance;
use crate::workloads::{Body, Case, Mode, WorkloadSpec};

/// W15 `minilm_onnx`, W14 `resnet50`, W14b `resnet50_b8` (listed after W15
/// `minilm` by [`crate::workloads::all`]; run only when a filter names
/// them, [`crate::workloads::MODEL_WORKLOADS`]).
pub fn specs() -> Vec<WorkloadSpec> {
    vec![
        WorkloadSpec {
            id: "W15",
            name: "minilm_onnx",
            what: "W15 through the ONNX importer: minilm.onnx (PyTorch's export) on the same ids and mask, every \
                   padded position computed as ONNX Runtime does -> [32, 384]",
            tolerance: Tolerance::TRANSCENDENTAL,
            tolerance_note: "erf in GELU, exp in the attention, rsqrt in 13 layer norms; unit-vector outputs",
            floor_bytes: None,
            modes: &[Mode::Eager, Mode::TracedJit],
            low_precision: Tolerance::BF16,
            build: build_minilm_onnx,
        },
        WorkloadSpec {
            id: "W14",
            name: "resnet50",
            what: "ResNet-50 through the ONNX importer (resnet50.onnx: opset 9, seeded weights), x [1, 3, 224, \
                   224] -> softmax [1, 1000]; 4.09 G multiply-adds",
            tolerance: Tolerance::TRANSCENDENTAL,
            tolerance_note: "sums of up to 4,608 products per convolution output over 53 layers; one-hot softmax",
            floor_bytes: None,
            // Eager convolutions run reference loops (seconds a call): the
            // eager result is the reference, computed once, not a timed row.
            modes: &[Mode::TracedJit],
            low_precision: Tolerance::BF16,
            build: build_resnet50,
        },
        WorkloadSpec {
            id: "W14b",
            name: "resnet50_b8",
            what: "W14 at batch 8 (image 0 is W14's): x [8, 3, 224, 224] -> [8, 1000]",
            tolerance: Tolerance::TRANSCENDENTAL,
            tolerance_note: "as W14",
            floor_bytes: None,
            modes: &[Mode::TracedJit],
            low_precision: Tolerance::BF16,
            build: build_resnet50_b8,
        },
    ]
}

/// W14b's batch.
pub const W14B_BATCH: usize = 8;

/// Where `make_models.py` writes the files.
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TRACEJIT_PEERS_MODELS") {
        return PathBuf::from(d);
    }
    PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tracejit-peers/models")
}

/// The model file `name` of [`models_dir`] imported, with the import's
/// time in ms, or why not.
pub fn import(name: &str) -> Result<(Arc<Model>, f64), String> {
    import_from(&models_dir(), name)
}

/// The model file `dir/name` imported, with the import's time in ms, or
/// why not (a missing file names itself and the script that makes it).
pub fn import_from(dir: &Path, name: &str) -> Result<(Arc<Model>, f64), String> {
    let path = dir.join(name);
    if !path.exists() {
        return Err(format!(
            "{} is missing: run shared/peers/models/make_models.py (or set TRACEJIT_PEERS_MODELS)",
            path.display()
        ));
    }
    let t0 = Instant::now();
    let model = tracejit::onnx::import(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((Arc::new(model), t0.elapsed().as_secs_f64() * 1e3))
}

/// W14 / W14b's images: `gen(110, [batch, 3, 224, 224], -1, 1)`.
pub fn images(batch: usize) -> Tensor {
    gen(110, &[batch, 3, 224, 224], -1.0, 1.0)
}

/// The model's first output on `inputs`, op by op where the tensors are.
fn first_output(model: &Model, inputs: &[Tensor]) -> Tensor {
    match model.evaluate(inputs) {
        Ok(mut outs) => outs.remove(0),
        Err(e) => panic!("{}: {e}", model.name()),
    }
}

fn build_resnet(dir: &Path, name: &'static str, batch: usize) -> Body {
    let model = match import_from(dir, "resnet50.onnx") {
        Ok((m, _)) => m,
        Err(e) => return Body::Unavailable(e),
    };
    Body::Runnable(Box::new(Case::new(name, images(batch), move |x: Tensor| first_output(&model, &[x]))))
}

/// W14: ResNet-50 at batch 1, softmax `[1, 1000]`.
pub fn build_resnet50() -> Body {
    build_resnet(&models_dir(), "resnet50", 1)
}

/// W14b: ResNet-50 at batch 8.
pub fn build_resnet50_b8() -> Body {
    build_resnet(&models_dir(), "resnet50_b8", W14B_BATCH)
}

/// W15 `minilm_onnx`: `minilm.onnx` on W15's ids and mask, `[32, 384]`.
pub fn build_minilm_onnx() -> Body {
    build_minilm_onnx_from(&models_dir())
}

fn build_minilm_onnx_from(dir: &Path) -> Body {
    let model = match import_from(dir, "minilm.onnx") {
        Ok((m, _)) => m,
        Err(e) => return Body::Unavailable(e),
    };
    let (ids, mask, _) = crate::minilm::inputs();
    Body::Runnable(Box::new(Case::new("minilm_onnx", (ids, mask), move |(ids, mask): (Tensor, Tensor)| {
        first_output(&model, &[ids, mask])
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable_reason(body: Body) -> String {
        match body {
            Body::Unavailable(reason) => reason,
            Body::Runnable(_) => panic!("a missing model file must make the row unavailable"),
        }
    }

    #[test]
    fn missing_files_make_the_rows_unavailable_naming_the_file_and_its_maker() {
        let dir = std::env::temp_dir().join(format!("tracejit-bench-no-models-{}", std::process::id()));
        for (body, file) in [
            (build_resnet(&dir, "resnet50", 1), "resnet50.onnx"),
            (build_resnet(&dir, "resnet50_b8", W14B_BATCH), "resnet50.onnx"),
            (build_minilm_onnx_from(&dir), "minilm.onnx"),
        ] {
            let reason = unavailable_reason(body);
            assert!(reason.contains(&dir.join(file).display().to_string()), "{reason}");
            assert!(reason.contains("make_models.py"), "{reason}");
        }
    }

    #[test]
    fn a_file_that_is_not_onnx_makes_the_row_unavailable_with_the_importers_error() {
        let dir = std::env::temp_dir().join(format!("tracejit-bench-bad-models-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("resnet50.onnx"), b"not a protobuf").unwrap();
        let reason = unavailable_reason(build_resnet(&dir, "resnet50", 1));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(reason.contains("resnet50.onnx: "), "{reason}");
    }
}
