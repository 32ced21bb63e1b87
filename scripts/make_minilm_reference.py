#!/usr/bin/env python3
"""Computes the reference fixture of tracejit-models' all-MiniLM-L6-v2 test.

For every line of crates/tracejit-models/tests/data/minilm_sentences.txt
(an empty line included) it writes what sentence-transformers gives:

- minilm_token_ids.json: the word-piece ids of Hugging Face's tokenizer
  (`model.tokenizer(line, truncation=True, max_length=256)`, [CLS] and
  [SEP] included), one list per line;
- minilm_reference.safetensors: `embeddings`, f32 [lines, 384], from
  `SentenceTransformer(model_dir, device="cpu").encode(lines,
  batch_size=32, convert_to_numpy=True)` (mean pooling and the model's
  Normalize module: unit vectors), computed in float32 by PyTorch.

Run with the peers' venv (`pip install sentence-transformers safetensors`),
after scripts/fetch_test_data.sh has unpacked the model:

    ~/.peers-venv/bin/python scripts/make_minilm_reference.py MODEL_DIR

Versions used for the committed fixture: sentence-transformers 6.2.0,
transformers 5.24.0, torch 2.15.0, tokenizers 0.23.3 (2026-11-29).
"""
import json
import pathlib
import sys

import numpy as np
import torch
from safetensors.numpy import save_file
from sentence_transformers import SentenceTransformer

here = pathlib.Path(__file__).resolve().parent.parent / "crates/tracejit-models/tests/data"
model_dir = sys.argv[1]
torch.set_num_threads(1)
lines = (here / "minilm_sentences.txt").read_text(encoding="utf-8").split("\n")[:-1]
model = SentenceTransformer(model_dir, device="cpu")
assert model.max_seq_length == 256, model.max_seq_length
ids = [model.tokenizer(l, truncation=True, max_length=model.max_seq_length)["input_ids"] for l in lines]
emb = model.encode(lines, batch_size=32, convert_to_numpy=True).astype(np.float32)
assert emb.shape == (len(lines), 384)
(here / "minilm_token_ids.json").write_text(json.dumps(ids) + "\n")
save_file({"embeddings": emb}, str(here / "minilm_reference.safetensors"))
print(f"{len(lines)} lines; longest {max(map(len, ids))} pieces; norms {np.linalg.norm(emb, axis=1).min():.6f}..")
