#!/usr/bin/env python3
"""all-MiniLM-L6-v2 as an ONNX file, written op by op from the model's own
model.safetensors, with no PyTorch: what CI imports to check tracejit's ONNX
importer on a real pretrained model against the native encoder
(crates/tracejit-models/tests/models/minilm_onnx.rs).

  python scripts/make_minilm_onnx.py --model DIR --out FILE

DIR is the model folder scripts/fetch_minilm.sh unpacks (config.json,
model.safetensors). Needs numpy and onnx (scripts/fetch_test_data.sh runs it
with its venv: `scripts/fetch_test_data.sh minilm-onnx`).

The graph is the one PyTorch's export of Hugging Face's BertModel +
sentence-transformers' pooling gives (shared/peers/models/make_models.py's
minilm.onnx), in standard opset-17 ops: inputs input_ids and attention_mask
(int64 [batch, seq], both dynamic), output sentence_embedding [batch, 384];
word + position + token-type-0 embeddings and LayerNormalization; per layer
q/k/v products, heads by Reshape/Transpose, scores scaled by 1/sqrt(32)
plus the mask as (1 - mask) * f32 min, Softmax, the output product,
residual and LayerNormalization, the FFN with GELU written with Erf; mean
pooling over the mask and L2 normalisation. Weights are stored transposed
([in, out]) for MatMul. The file is deterministic (fixed names, no
timestamps) and passes onnx.checker's full check.
"""

import argparse
import json
import os
import struct

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DTYPES = {"F32": np.float32, "I64": np.int64}


def read_safetensors(path):
    """The tensors of a safetensors file as numpy arrays (the format is an
    8-byte header length, a JSON header, then the raw little-endian data)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        arr = np.frombuffer(data[lo:hi], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        out[name.removeprefix("bert.")] = arr
    return out


class Builder:
    """Nodes and initializers, each named once."""

    def __init__(self):
        self.nodes, self.inits, self.count = [], [], 0

    def init(self, name, arr):
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def const(self, value, dtype=np.float32):
        self.count += 1
        return self.init(f"const_{self.count}", np.array(value, dtype=dtype))

    def op(self, op_type, inputs, **attrs):
        self.count += 1
        out = f"{op_type.lower()}_{self.count}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"n{self.count}_{op_type}", **attrs))
        return out


def linear(b, x, w, bias, name):
    """x · wᵀ + bias, the weight stored transposed."""
    wt = b.init(f"{name}.weight_t", w.T)
    bb = b.init(f"{name}.bias", bias)
    return b.op("Add", [b.op("MatMul", [x, wt]), bb])


def layer_norm(b, x, t, name, eps):
    w, bias = b.init(f"{name}.weight", t[f"{name}.weight"]), b.init(f"{name}.bias", t[f"{name}.bias"])
    return b.op("LayerNormalization", [x, w, bias], axis=-1, epsilon=eps)


def build(model_dir):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    t = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    heads, hidden, eps = cfg["num_attention_heads"], cfg["hidden_size"], cfg["layer_norm_eps"]
    dh = hidden // heads
    b = Builder()

    # Embeddings: word + position (the table's first seq rows) + token type 0, then LayerNorm.
    word = b.op("Gather", [b.init("embeddings.word_embeddings.weight", t["embeddings.word_embeddings.weight"]), "input_ids"])
    seq = b.op("Shape", ["input_ids"], start=1, end=2)
    table = b.init("embeddings.position_embeddings.weight", t["embeddings.position_embeddings.weight"])
    pos = b.op("Slice", [table, b.const([0], np.int64), seq, b.const([0], np.int64)])
    tt0 = b.init("embeddings.token_type_embeddings.row0", t["embeddings.token_type_embeddings.weight"][0])
    h = layer_norm(b, b.op("Add", [b.op("Add", [word, pos]), tt0]), t, "embeddings.LayerNorm", eps)

    # The additive mask [batch, 1, 1, seq]: 0 where attended, f32 min where padding.
    maskf = b.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    additive = b.op("Mul", [b.op("Sub", [b.const(1.0), maskf]), b.const(np.finfo(np.float32).min)])
    additive = b.op("Unsqueeze", [additive, b.const([1, 2], np.int64)])
    split = b.const([0, 0, heads, dh], np.int64)
    merge = b.const([0, 0, hidden], np.int64)
    scale = b.const(1.0 / np.sqrt(dh))

    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        qkv = {}
        for n in ("query", "key", "value"):
            x = linear(b, h, t[f"{p}.attention.self.{n}.weight"], t[f"{p}.attention.self.{n}.bias"], f"{p}.attention.self.{n}")
            perm = [0, 2, 3, 1] if n == "key" else [0, 2, 1, 3]
            qkv[n] = b.op("Transpose", [b.op("Reshape", [x, split])], perm=perm)
        scores = b.op("Add", [b.op("Mul", [b.op("MatMul", [qkv["query"], qkv["key"]]), scale]), additive])
        ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), qkv["value"]])
        ctx = b.op("Reshape", [b.op("Transpose", [ctx], perm=[0, 2, 1, 3]), merge])
        out = linear(b, ctx, t[f"{p}.attention.output.dense.weight"], t[f"{p}.attention.output.dense.bias"], f"{p}.attention.output.dense")
        h = layer_norm(b, b.op("Add", [out, h]), t, f"{p}.attention.output.LayerNorm", eps)
        inter = linear(b, h, t[f"{p}.intermediate.dense.weight"], t[f"{p}.intermediate.dense.bias"], f"{p}.intermediate.dense")
        # GELU with erf: x/2 · (1 + erf(x/√2)).
        erf = b.op("Erf", [b.op("Div", [inter, b.const(np.sqrt(2.0))])])
        gelu = b.op("Mul", [b.op("Mul", [inter, b.const(0.5)]), b.op("Add", [erf, b.const(1.0)])])
        out = linear(b, gelu, t[f"{p}.output.dense.weight"], t[f"{p}.output.dense.bias"], f"{p}.output.dense")
        h = layer_norm(b, b.op("Add", [out, h]), t, f"{p}.output.LayerNorm", eps)

    # Mean pooling over the mask, then L2 normalisation (sentence-transformers').
    m3 = b.op("Unsqueeze", [maskf, b.const([2], np.int64)])
    axis1 = b.const([1], np.int64)
    summed = b.op("ReduceSum", [b.op("Mul", [h, m3]), axis1], keepdims=0)
    count = b.op("Max", [b.op("ReduceSum", [m3, axis1], keepdims=0), b.const(1e-9)])
    mean = b.op("Div", [summed, count])
    norm = b.op("Sqrt", [b.op("ReduceSum", [b.op("Mul", [mean, mean]), axis1], keepdims=1)])
    b.nodes.append(
        helper.make_node("Div", [mean, b.op("Max", [norm, b.const(1e-12)])], ["sentence_embedding"], name="pool_normalize")
    )

    graph = helper.make_graph(
        b.nodes,
        "all_minilm_l6_v2",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", hidden])],
        b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tracejit scripts/make_minilm_onnx.py")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the all-MiniLM-L6-v2 folder (config.json, model.safetensors)")
    ap.add_argument("--out", required=True, help="the .onnx file to write")
    a = ap.parse_args()
    model = build(a.model)
    tmp = a.out + ".tmp"
    onnx.save(model, tmp)
    os.replace(tmp, a.out)
    print(f"wrote {a.out} ({os.path.getsize(a.out) >> 20} MiB, {len(model.graph.node)} nodes)")


if __name__ == "__main__":
    main()
