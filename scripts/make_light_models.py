#!/usr/bin/env python3
"""Makes the nine `light` ImageNet models of onnx 1.22.0's backend test data
runnable, and ONNX Runtime's outputs on them, for the importer's real-model
test (crates/tracejit-onnx/tests/onnx/real_models.rs).

The wheel ships `onnx/backend/test/data/light/light_<name>.onnx` (AlexNet,
DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19,
ZFNet-512: the Caffe2 model-zoo graphs at opset 9) with every weight a
`ConstantOfShape` placeholder of zeros. As shared/peers/models/make_models.py
does for ResNet-50 (W14's resnet50.onnx), each placeholder becomes a seeded
f32 initializer of its shape, drawn in graph order from
`numpy.random.default_rng(0)`, by the role of the tensor it feeds:

- rank >= 2 (convolution and dense weights): He-normal N(0, sqrt(2 / fan_in));
- batch-norm scale, or a per-channel scale (DenseNet's Unsqueeze -> Mul):
  U(0.8, 1.2); running variance U(0.5, 1.5);
- biases, running means, per-channel shifts (Unsqueeze -> Add): N(0, 0.05).

Unused initializers are dropped and `ir_version` 3 -> 4 (weights are not
graph inputs). ResNet-50 gets exactly make_models.py's treatment (batch dim
`N`, the classifier's Reshape target [-1, 2048]), so `resnet50.onnx` here is
byte-identical to W14's file (the script checks the sha256).

For each model it then runs ONNX Runtime (CPUExecutionProvider, default
optimizations, one thread) on a seeded input `x ~ U(-1, 1)` of the input's
shape and writes, into OUT/<name>/:

- `input_0.pb`: x, a serialized TensorProto (`onnx::load_tensor` reads it);
- `output_0.pb`: the model's output;
- `logits.pb`: the input of the final Softmax (the output itself where the
  graph has none), computed by ORT on the same model with that value
  exposed as an extra graph output; the tensor's `name` is the value's name.
  With random weights the softmax is one-hot, so tests compare the logits.

Usage (needs numpy, onnx==1.22.0, onnxruntime==1.32.0; the peers' venv has
them; scripts/fetch_test_data.sh runs it):

    python scripts/make_light_models.py ONNX_TEST_DATA_DIR OUT_DIR

where ONNX_TEST_DATA_DIR is the unpacked `onnx/backend/test/data` (it holds
`light/`). Two runs write identical files.
"""
import hashlib
import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper

SEED = 0
MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
          "squeezenet", "vgg19", "zfnet512"]
# sha256 of W14's resnet50.onnx (shared/peers/models/MANIFEST.json).
RESNET50_SHA256_PREFIX = "39c2ccb1fee9f4d3"


def log(*a):
    print("make_light_models:", *a, file=sys.stderr, flush=True)


def roles(g):
    """placeholder output name -> role, from the op that consumes it (through an Unsqueeze or a
    Reshape, as DenseNet's per-channel scales and Inception v1's classifier weight are fed)."""
    consumers = {}
    for n in g.node:
        for k, i in enumerate(n.input):
            consumers.setdefault(i, []).append((n, k))
    role = {}
    for n in g.node:
        if n.op_type == "BatchNormalization":
            role.update(zip(n.input[1:5], ("scale", "bias", "mean", "var")))
        elif n.op_type in ("Conv", "Gemm"):
            role[n.input[1]] = "weight"
            if len(n.input) > 2:
                role[n.input[2]] = "bias"
    for n in g.node:
        if n.op_type in ("Unsqueeze", "Reshape") and n.input[0] not in role:
            uses = consumers.get(n.output[0], [])
            if n.op_type == "Reshape" and role.get(n.output[0]) == "weight":
                role[n.input[0]] = "weight"
            elif uses and all(u.op_type == "Mul" for u, _ in uses):
                role[n.input[0]] = "scale"
            elif uses and all(u.op_type == "Add" for u, _ in uses):
                role[n.input[0]] = "bias"
            elif n.output[0] in role:
                role[n.input[0]] = role[n.output[0]]
    return role


def seeded_weights(m, name, seed=SEED):
    """Replaces the ConstantOfShape placeholders of m's graph (in place)."""
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    role = roles(g)
    rng = np.random.default_rng(seed)
    nodes, new, counts = [], [], {}
    for n in g.node:
        if not (n.op_type == "ConstantOfShape" and n.input[0] in inits):
            nodes.append(n)
            continue
        shape = tuple(int(v) for v in numpy_helper.to_array(inits[n.input[0]]))
        r = role.get(n.output[0])
        if len(shape) >= 2:
            assert r == "weight", (name, n.output[0], r)
            v = rng.normal(0.0, (2.0 / int(np.prod(shape[1:]))) ** 0.5, shape)
        elif r == "scale":
            v = rng.uniform(0.8, 1.2, shape)
        elif r == "var":
            v = rng.uniform(0.5, 1.5, shape)
        else:
            assert r in ("bias", "mean"), (name, n.output[0], r)
            v = rng.normal(0.0, 0.05, shape)
        counts[r] = counts.get(r, 0) + 1
        new.append(numpy_helper.from_array(v.astype(np.float32), n.output[0]))
    used = {i for n in nodes for i in n.input}
    old = [t for t in g.initializer if t.name in used]
    if name == "resnet50":   # the Reshape before the classifier: [1, 2048] -> [-1, 2048] (any batch)
        for k, t in enumerate(old):
            if t.name == "OC2_DUMMY_1":
                assert list(numpy_helper.to_array(t)) == [1, 2048]
                old[k] = numpy_helper.from_array(np.array([-1, 2048], np.int64), t.name)
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(old + new)
    names = {t.name for t in g.initializer}
    inputs = [i for i in g.input if i.name in used and i.name not in names]
    assert len(inputs) == 1, (name, [i.name for i in inputs][:5])
    del g.input[:]
    g.input.extend(inputs)
    if name == "resnet50":
        for v in (g.input[0], g.output[0]):
            dim = v.type.tensor_type.shape.dim[0]
            dim.Clear()
            dim.dim_param = "N"
        m.doc_string = ("light_resnet50 from onnx 1.22.0's backend test data with seeded random weights "
                        "(peers/models/make_models.py, numpy default_rng(%d))" % seed)
    else:
        m.doc_string = ("light_%s from onnx 1.22.0's backend test data with seeded random weights "
                        "(scripts/make_light_models.py, numpy default_rng(%d))" % (name, seed))
    m.ir_version = 4
    onnx.checker.check_model(m, full_check=True)
    log("%s: %d placeholders replaced %s, %d initializers kept, %d nodes" % (name, len(new), counts, len(old),
                                                                              len(nodes)))


def logits_value(g):
    """The final Softmax's input, or the graph's output when it ends in no Softmax."""
    out = g.output[0].name
    for n in g.node:
        if n.op_type == "Softmax" and n.output[0] == out:
            return n.input[0]
    return out


def write_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def references(m, name, out_dir):
    import onnxruntime as ort
    g = m.graph
    logits = logits_value(g)
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    if logits != g.output[0].name:
        probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(logits))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
    shape = [d.dim_value if d.dim_value > 0 else 1 for d in g.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(1).uniform(-1.0, 1.0, shape).astype(np.float32)
    outs = sess.run(None, {g.input[0].name: x})
    y, z = outs[0], outs[-1]
    assert np.isfinite(z).all(), name
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    write_atomic(os.path.join(d, "input_0.pb"), numpy_helper.from_array(x, g.input[0].name).SerializeToString())
    write_atomic(os.path.join(d, "output_0.pb"), numpy_helper.from_array(y, g.output[0].name).SerializeToString())
    write_atomic(os.path.join(d, "logits.pb"), numpy_helper.from_array(z, logits).SerializeToString())
    log("%s: input %s, logits '%s' %s (std %.3g, argmax %d), ORT %s" % (name, shape, logits, list(z.shape),
                                                                         float(z.std()), int(z.argmax()),
                                                                         ort.__version__))


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: make_light_models.py ONNX_TEST_DATA_DIR OUT_DIR")
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for name in MODELS:
        m = onnx.load(os.path.join(src, "light", "light_%s.onnx" % name))
        seeded_weights(m, name)
        data = m.SerializeToString()
        sha = hashlib.sha256(data).hexdigest()
        if name == "resnet50" and not sha.startswith(RESNET50_SHA256_PREFIX):
            sys.exit("resnet50.onnx: sha256 %s, W14's file has %s..." % (sha, RESNET50_SHA256_PREFIX))
        write_atomic(os.path.join(out, name + ".onnx"), data)
        references(m, name, out)
    log("done: %s" % out)


if __name__ == "__main__":
    main()
