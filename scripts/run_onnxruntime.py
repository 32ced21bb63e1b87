#!/usr/bin/env python3
"""Runs tracejit-exported ONNX files in onnxruntime and compares the results
with tracejit's.

Each argument is a directory in the ONNX backend-test layout, as
`tracejit::onnx::Exporter::save_test_case` writes it:

    <case>/model.onnx
    <case>/test_data_set_0/input_<i>.pb    serialized TensorProto
    <case>/test_data_set_0/output_<i>.pb   what tracejit computed

or a directory holding such case directories (searched recursively). Every
model is also checked with onnx.checker (full check, shape inference
included). The export tests write their cases with

    TRACEJIT_ONNX_CASES=/tmp/onnx-cases cargo test --workspace --test onnx -- export::
    python3 scripts/run_onnxruntime.py /tmp/onnx-cases

Needs `pip install onnx onnxruntime numpy`. Prints one line per case and a
closing `N passed, M failed`; exits 1 if any case failed.
"""

import argparse
import glob
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


def load_tensors(folder, kind):
    paths = sorted(glob.glob(os.path.join(folder, f"{kind}_*.pb")),
                   key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))
    tensors = []
    for path in paths:
        t = onnx.TensorProto()
        with open(path, "rb") as f:
            t.ParseFromString(f.read())
        tensors.append(numpy_helper.to_array(t))
    return tensors


def close(got, want, rtol, atol):
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"dtype/shape {got.dtype}{got.shape} != {want.dtype}{want.shape}"
    if want.dtype.kind == "f":
        ok = np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
        if not ok.all():
            i = np.argwhere(~ok)[0]
            return f"element {tuple(i)}: onnxruntime {got[tuple(i)]}, tracejit {want[tuple(i)]}"
        return None
    return None if np.array_equal(got, want) else "values differ"


def run_case(case, rtol, atol):
    model_path = os.path.join(case, "model.onnx")
    model = onnx.load(model_path)
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for data in sorted(glob.glob(os.path.join(case, "test_data_set_*"))):
        inputs = load_tensors(data, "input")
        want = load_tensors(data, "output")
        got = session.run(None, dict(zip(names, inputs)))
        for k, (g, w) in enumerate(zip(got, want)):
            problem = close(np.asarray(g), w, rtol, atol)
            if problem:
                return f"output {k}: {problem}"
    return None


def find_cases(roots):
    for root in roots:
        if os.path.exists(os.path.join(root, "model.onnx")):
            yield root
            continue
        for dirpath, _, files in sorted(os.walk(root)):
            if "model.onnx" in files:
                yield dirpath


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", help="case directories, or directories holding them")
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--atol", type=float, default=1e-5)
    args = parser.parse_args()
    print(f"onnx {onnx.__version__}, onnxruntime {ort.__version__}")
    passed = failed = 0
    for case in find_cases(args.dirs):
        try:
            problem = run_case(case, args.rtol, args.atol)
        except Exception as e:  # a model the runtime rejects is a failure, reported as such
            problem = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if problem:
            failed += 1
            print(f"FAIL {case}: {problem}")
        else:
            passed += 1
            print(f"ok   {case}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
