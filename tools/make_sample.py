"""Build the bundled sample (minips/sample/) from the full Fashion-MNIST IDX files.

The sample is class-balanced: the first PER_CLASS_TRAIN images of each class from the
official training set and the first PER_CLASS_TEST of each class from the official test set,
kept in their original (already shuffled) order. Written as gzipped IDX files with a zero
timestamp, so re-running this script gives byte-identical files.

    python tools/make_sample.py [--source /usr/share/datasets/fashion-mnist] [--out minips/sample]
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np

from minips.data import IDX_FILES, load_dataset, read_idx
from minips.data.datasets import idx_paths
from minips.provision.fetch import write_idx

PER_CLASS_TRAIN = 550  # 5,500 training images: ~2.4 MB gzipped
PER_CLASS_TEST = 100  # 1,000 test images: ~0.44 MB gzipped
SIZE_BUDGET_BYTES = 3_000_000
N_CLASSES = 10

README = """\
minips bundled sample: a class-balanced subset of Fashion-MNIST
================================================================

Files: the four standard IDX files (gzipped) holding {n_train} training images
({per_train} per class) and {n_test} test images ({per_test} per class), 28x28 grayscale,
labels 0-9 (T-shirt/top, Trouser, Pullover, Dress, Coat, Sandal, Shirt, Sneaker, Bag,
Ankle boot).

Source: Fashion-MNIST by Zalando Research, https://github.com/zalandoresearch/fashion-mnist
(Han Xiao, Kashif Rasul, Roland Vollgraf, "Fashion-MNIST: a Novel Image Dataset for
Benchmarking Machine Learning Algorithms", arXiv:1708.07747, 2017).

Licence: Fashion-MNIST is released under the MIT License:

    The MIT License (MIT) Copyright (c) 2017 Zalando SE, https://tech.zalando.com

    Permission is hereby granted, free of charge, to any person obtaining a copy of this
    software and associated documentation files (the "Software"), to deal in the Software
    without restriction, including without limitation the rights to use, copy, modify,
    merge, publish, distribute, sublicense, and/or sell copies of the Software, and to
    permit persons to whom the Software is furnished to do so, subject to the following
    conditions:

    The above copyright notice and this permission notice shall be included in all copies
    or substantial portions of the Software.

    THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED,
    INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A
    PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT
    HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF
    CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR
    THE USE OR OTHER DEALINGS IN THE SOFTWARE.

How it was built: `python tools/make_sample.py` (in the minips source tree) from the full
Fashion-MNIST files of Debian's dataset-fashion-mnist package
(/usr/share/datasets/fashion-mnist). It keeps the first {per_train} images of each class
of the official training set and the first {per_test} of each class of the official test
set, in their original order, unmodified, and writes them as gzipped IDX files with a zero
timestamp, so the build is reproducible. MD5 of the files:

{md5s}
"""


def balanced_indices(labels: np.ndarray, per_class: int) -> np.ndarray:
    """Indices of the first ``per_class`` examples of each class, in original order."""
    picks = [np.flatnonzero(labels == c)[:per_class] for c in range(N_CLASSES)]
    if any(len(p) < per_class for p in picks):
        raise SystemExit(f"source has fewer than {per_class} examples of some class")
    return np.sort(np.concatenate(picks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parents[1] / "minips/sample")
    args = parser.parse_args()

    paths = idx_paths(args.source)
    if paths is None:
        raise SystemExit(f"no Fashion-MNIST IDX files in {args.source}")
    args.out.mkdir(parents=True, exist_ok=True)
    splits = {"train": PER_CLASS_TRAIN, "test": PER_CLASS_TEST}
    for split, per_class in splits.items():
        images = read_idx(paths[f"{split}_images"])  # (N, 28, 28) uint8
        labels = read_idx(paths[f"{split}_labels"])  # (N,) uint8
        keep = balanced_indices(labels, per_class)
        write_idx(args.out / f"{IDX_FILES[f'{split}_images']}.gz", images[keep])
        write_idx(args.out / f"{IDX_FILES[f'{split}_labels']}.gz", labels[keep])

    gz_files = sorted(args.out.glob("*.gz"))
    total = sum(p.stat().st_size for p in gz_files)
    md5s = "\n".join(f"    {hashlib.md5(p.read_bytes()).hexdigest()}  {p.name}" for p in gz_files)
    (args.out / "README.txt").write_text(
        README.format(
            n_train=PER_CLASS_TRAIN * N_CLASSES,
            per_train=PER_CLASS_TRAIN,
            n_test=PER_CLASS_TEST * N_CLASSES,
            per_test=PER_CLASS_TEST,
            md5s=md5s,
        )
    )
    print(f"wrote {len(gz_files)} files, {total:,} bytes, to {args.out}")
    if total > SIZE_BUDGET_BYTES:
        raise SystemExit(f"sample is {total:,} bytes, over the {SIZE_BUDGET_BYTES:,} budget")
    sample = load_dataset("sample", data_dir=args.out.parent)
    print(f"check: {sample}")


if __name__ == "__main__":
    main()
