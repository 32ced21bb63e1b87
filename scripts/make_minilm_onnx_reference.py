#!/usr/bin/env python3
"""Computes ONNX Runtime's fixture for tracejit-models' minilm_onnx test
(crates/tracejit-models/tests/models/minilm_onnx.rs): all-MiniLM-L6-v2 exported
by PyTorch (`minilm.onnx` of shared/peers/models/make_models.py, sha256
adc0c5b80ae586d1..., mean pooling and L2 normalization in the graph) on a
small batch of token ids.

Writes, into crates/tracejit-models/tests/data/minilm_onnx/ (serialized
TensorProtos, `tracejit::onnx::load_tensor` reads them; ~8 KB):

- input_ids.pb, attention_mask.pb: int64 [4, 24]; rows of 24, 17, 9 and 3
  tokens ([CLS] ... [SEP], ids from numpy default_rng(7) in [1000, 30000))
  then [PAD] = 0 with mask 0, so padding, a short row and a full row meet;
- sentence_embedding.pb: f32 [4, 384], ONNX Runtime's output
  (CPUExecutionProvider, one thread, default optimizations).

Usage (the peers' venv has numpy, onnx and onnxruntime):

    ~/.peers-venv/bin/python scripts/make_minilm_onnx_reference.py ~/.cache/tracejit-peers/models/minilm.onnx

Versions used for the committed fixture: onnxruntime 1.32.0, onnx 1.22.0,
numpy 2.4.6 (2026-11-29).
"""
import hashlib
import os
import pathlib
import sys

import numpy as np
import onnxruntime as ort
from onnx import numpy_helper

OUT = pathlib.Path(__file__).resolve().parent.parent / "crates/tracejit-models/tests/data/minilm_onnx"
SHA256_PREFIX = "adc0c5b80ae586d1"
LENGTHS = [24, 17, 9, 3]


def main():
    path = sys.argv[1]
    data = open(path, "rb").read()
    sha = hashlib.sha256(data).hexdigest()
    if not sha.startswith(SHA256_PREFIX):
        sys.exit("%s: sha256 %s, expected %s... (make_models.py's export)" % (path, sha, SHA256_PREFIX))
    rng = np.random.default_rng(7)
    b, t = len(LENGTHS), max(LENGTHS)
    ids = np.zeros((b, t), np.int64)
    mask = np.zeros((b, t), np.int64)
    for r, n in enumerate(LENGTHS):
        ids[r, :n] = rng.integers(1000, 30000, n)
        ids[r, 0], ids[r, n - 1] = 101, 102
        mask[r, :n] = 1
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    (emb,) = sess.run(None, {"input_ids": ids, "attention_mask": mask})
    assert emb.shape == (b, 384) and emb.dtype == np.float32, (emb.shape, emb.dtype)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, v in (("input_ids", ids), ("attention_mask", mask), ("sentence_embedding", emb)):
        (OUT / (name + ".pb")).write_bytes(numpy_helper.from_array(v, name).SerializeToString())
    print("wrote %s (norms %s)" % (OUT, np.linalg.norm(emb, axis=1)))


if __name__ == "__main__":
    main()
