"""Writes examples/data/digits.safetensors from scikit-learn's copy of the
UCI "Optical Recognition of Handwritten Digits" data set (CC BY 4.0).

Run once, from the repository root:

    pip install scikit-learn safetensors numpy
    python3 examples/data/make_digits.py

The output is deterministic (same bytes on every run): the tensors are
stored in the data set's own order; shuffling and the train/test split
happen in the Rust example with a fixed seed.
"""

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from sklearn.datasets import load_digits

OUT = Path(__file__).resolve().parent / "digits.safetensors"


def main() -> None:
    digits = load_digits()
    # Pixels are counts 0..16 (4x4 blocks of a 32x32 bitmap); k/16 is exact in f32.
    images = (digits.data / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    assert images.shape == (1797, 64) and labels.shape == (1797,)
    assert images.min() == 0.0 and images.max() == 1.0
    assert sorted(set(labels.tolist())) == list(range(10))
    save_file(
        {"images": np.ascontiguousarray(images), "labels": labels},
        str(OUT),
        # One metadata key: safetensors writes several in hash order, and
        # the file should come out byte-identical on every run.
        metadata={
            "about": "images: f32 [1797, 64], 8x8 images row-major, pixel counts 0..16 divided by 16; "
            "labels: i64 [1797], the digit 0..9. Source: UCI Machine Learning Repository, Optical "
            "Recognition of Handwritten Digits (E. Alpaydin, C. Kaynak, 1998), doi:10.24432/C50P49, "
            "as shipped by scikit-learn (sklearn.datasets.load_digits). License: CC BY 4.0."
        },
    )
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
