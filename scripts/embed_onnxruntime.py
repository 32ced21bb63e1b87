#!/usr/bin/env python3
"""The embed example's pipeline in ONNX Runtime, for side-by-side figures.

Embeds every line of FILE with all-MiniLM-L6-v2 as `examples/embed.rs`
does (Hugging Face's tokenizer from the model's tokenizer.json, truncation
at 256 pieces, lines sorted by length and cut into batches of 32, each
padded to its own longest, mean pooling over the mask, L2 normalization),
running the encoder in ONNX Runtime (`minilm.onnx` of
shared/peers/models/make_models.py: the same BERT, pooling and
normalization inside the graph) with `--threads` intra-op threads, and
prints lines/s. `--paragraphs` first turns a text into one paragraph per
line (blank-line separated, inner newlines to spaces), as used for War and
Peace in the README.

    ~/.peers-venv/bin/python scripts/embed_onnxruntime.py --model-onnx MINILM_ONNX \
        --tokenizer MODEL_DIR/tokenizer.json --threads 1 FILE
"""
import argparse
import time

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer


def paragraphs(text):
    out = []
    for block in text.replace("\r", "").split("\n\n"):
        p = " ".join(l.strip() for l in block.split("\n") if l.strip())
        if p:
            out.append(p)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-onnx", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--paragraphs", action="store_true", help="embed FILE's paragraphs, not its lines")
    ap.add_argument("--write-lines", help="write the texts embedded, one per line, to this file")
    ap.add_argument("file")
    a = ap.parse_args()
    text = open(a.file, encoding="utf-8").read()
    texts = paragraphs(text) if a.paragraphs else text.split("\n")[: text.count("\n")]
    if a.write_lines:
        open(a.write_lines, "w", encoding="utf-8").write("".join(t + "\n" for t in texts))
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    t0 = time.perf_counter()
    sess = ort.InferenceSession(a.model_onnx, so, providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_file(a.tokenizer)
    tok.no_padding()
    tok.enable_truncation(256)
    t1 = time.perf_counter()
    ids = [e.ids for e in tok.encode_batch(texts)]
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    out = np.zeros((len(ids), 384), np.float32)
    for s in range(0, len(order), a.batch):
        rows = order[s:s + a.batch]
        n = max(len(ids[i]) for i in rows)
        x = np.zeros((len(rows), n), np.int64)
        m = np.zeros((len(rows), n), np.int64)
        for r, i in enumerate(rows):
            x[r, :len(ids[i])] = ids[i]
            m[r, :len(ids[i])] = 1
        out[rows] = sess.run(None, {"input_ids": x, "attention_mask": m})[0]
    t2 = time.perf_counter()
    print(f"{len(texts)} texts, {sum(map(len, ids))} word pieces: session {t1 - t0:.2f} s, embedding "
          f"{t2 - t1:.2f} s ({len(texts) / (t2 - t1):.1f} texts/s) at {a.threads} thread(s)")


if __name__ == "__main__":
    main()
