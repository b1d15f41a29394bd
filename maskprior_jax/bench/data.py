"""Datasets for the vision and language benchmarks, as in-memory NumPy arrays.

Embedded defaults that need no download:
- "digits": the 8x8 handwritten digits that ship inside scikit-learn (1,797 images of
  0..9, 16 grey levels; UCI optdigits test set). Split 80/20 by a fixed permutation.
- "pydoc": the English prose of Python's own help topics (`pydoc_data.topics`, about
  465 KB, shipped with CPython). The first 90% of the bytes train, the last 10% test.

Real datasets come through tensorflow-datasets' random-access `tfds.data_source` (array_record
files, no TensorFlow needed): any image-classification dataset with "image" and "label"
features (mnist, fashion_mnist, cifar10, cifar100, ...), a text dataset with a "text" feature
for the character LM (tiny_shakespeare), or "text" + "label" for classification
(imdb_reviews). A multi-host run reads only its host's share of the training split
(every process_count-th example). Datasets must be prepared beforehand, in array_record
format, with `tfds build NAME --file_format=array_record --data_dir=DIR`.
"""
from __future__ import annotations

import dataclasses

import numpy as np

EMBEDDED_VISION = ("digits",)
EMBEDDED_TEXT = ("pydoc",)


class DataError(ValueError):
  """A dataset that cannot be loaded, with how to fix it (reported as one line)."""


@dataclasses.dataclass
class ImageData:
  """train_x/test_x: (N, H, W, C) float32 in [0, 1]; labels int32 (N,)."""
  train_x: np.ndarray
  train_y: np.ndarray
  test_x: np.ndarray
  test_y: np.ndarray
  num_classes: int
  name: str


@dataclasses.dataclass
class TextData:
  """Byte-level text: train/test uint8 arrays of UTF-8 bytes (vocabulary 256)."""
  train: np.ndarray
  test: np.ndarray
  name: str


@dataclasses.dataclass
class TextClassData:
  """Byte-level classification: (N, max_len) uint8 tokens, (N,) bool padding masks, labels."""
  train_x: np.ndarray
  train_mask: np.ndarray
  train_y: np.ndarray
  test_x: np.ndarray
  test_mask: np.ndarray
  test_y: np.ndarray
  num_classes: int
  name: str


def digits(seed: int = 0, test_fraction: float = 0.2) -> ImageData:
  from sklearn.datasets import load_digits
  d = load_digits()
  x = (d.images / 16.0).astype(np.float32)[..., None]
  y = d.target.astype(np.int32)
  perm = np.random.default_rng(seed).permutation(len(x))
  n_test = int(round(test_fraction * len(x)))
  te, tr = perm[:n_test], perm[n_test:]
  return ImageData(x[tr], y[tr], x[te], y[te], 10, "digits")


def pydoc_text(test_fraction: float = 0.1) -> TextData:
  from pydoc_data.topics import topics
  text = "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
  data = np.frombuffer(text, np.uint8)
  cut = int(len(data) * (1 - test_fraction))
  return TextData(data[:cut].copy(), data[cut:].copy(), "pydoc")


def _source(name: str, split: str, data_dir: str | None):
  embedded = ", ".join(EMBEDDED_VISION + EMBEDDED_TEXT)
  try:
    import tensorflow_datasets as tfds
  except ImportError:
    raise DataError(f"dataset {name!r} is not embedded ({embedded}) and TFDS datasets need tensorflow-datasets: "
                    "pip install -e '.[data]' in a clone, or pip install 'maskprior-jax[data]'") from None
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # not registered, not prepared, or prepared in another format
    where = f"--data-dir {data_dir}" if data_dir else "the default TFDS data_dir (~/tensorflow_datasets)"
    reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
    raise DataError(f"dataset {name!r} is not embedded ({embedded}) and TFDS split {split!r} is not readable in "
                    f"{where} ({reason}); prepare it on a machine with network access with `tfds build {name} "
                    f"--file_format=array_record --data_dir DIR` and pass --data-dir DIR") from None


def _host_indices(n: int, process_index: int, process_count: int) -> np.ndarray:
  return np.arange(process_index, n, process_count)


def _read(source, indices, keys):
  out = {k: [] for k in keys}
  for i in indices:
    rec = source[int(i)]
    for k in keys:
      if k not in rec:
        raise DataError(f"the dataset's records have no {k!r} feature (they have {', '.join(rec)})")
      out[k].append(rec[k])
  return out


def _num_classes(name, data_dir, labels):
  try:
    import tensorflow_datasets as tfds
    return int(tfds.builder(name, data_dir=data_dir).info.features["label"].num_classes)
  except Exception:  # fall back to the labels seen
    return int(np.max(labels)) + 1


def tfds_images(name: str, *, data_dir: str | None = None, train_split: str = "train",
                test_split: str = "test", process_index: int = 0, process_count: int = 1) -> ImageData:
  train, test = _source(name, train_split, data_dir), _source(name, test_split, data_dir)
  tr = _read(train, _host_indices(len(train), process_index, process_count), ("image", "label"))
  te = _read(test, range(len(test)), ("image", "label"))
  to_x = lambda imgs: (np.stack(imgs).astype(np.float32) / 255.0)
  train_y, test_y = np.asarray(tr["label"], np.int32), np.asarray(te["label"], np.int32)
  x_tr, x_te = to_x(tr["image"]), to_x(te["image"])
  if x_tr.ndim == 3:
    x_tr, x_te = x_tr[..., None], x_te[..., None]
  return ImageData(x_tr, train_y, x_te, test_y, _num_classes(name, data_dir, train_y), name)


def _as_bytes(t) -> bytes:
  return t if isinstance(t, bytes) else str(t).encode("utf-8")


def tfds_text(name: str, *, data_dir: str | None = None, train_split: str = "train",
              test_split: str = "test", process_index: int = 0, process_count: int = 1) -> TextData:
  train, test = _source(name, train_split, data_dir), _source(name, test_split, data_dir)
  tr = _read(train, _host_indices(len(train), process_index, process_count), ("text",))
  te = _read(test, range(len(test)), ("text",))
  join = lambda texts: np.frombuffer(b"\n".join(_as_bytes(t) for t in texts), np.uint8).copy()
  return TextData(join(tr["text"]), join(te["text"]), name)


def tfds_text_classification(name: str, max_len: int, *, data_dir: str | None = None,
                             train_split: str = "train", test_split: str = "test",
                             process_index: int = 0, process_count: int = 1) -> TextClassData:
  train, test = _source(name, train_split, data_dir), _source(name, test_split, data_dir)
  tr = _read(train, _host_indices(len(train), process_index, process_count), ("text", "label"))
  te = _read(test, range(len(test)), ("text", "label"))

  def pad(texts):
    x = np.zeros((len(texts), max_len), np.uint8)
    m = np.zeros((len(texts), max_len), bool)
    for i, t in enumerate(texts):
      b = np.frombuffer(_as_bytes(t)[:max_len], np.uint8)
      x[i, :len(b)], m[i, :len(b)] = b, True
    return x, m
  (xtr, mtr), (xte, mte) = pad(tr["text"]), pad(te["text"])
  ytr, yte = np.asarray(tr["label"], np.int32), np.asarray(te["label"], np.int32)
  return TextClassData(xtr, mtr, ytr, xte, mte, yte, _num_classes(name, data_dir, ytr), name)


def is_text_classification(name: str, data_dir: str | None = None) -> bool:
  """True for a TFDS text dataset whose records carry a label."""
  if name in EMBEDDED_TEXT:
    return False
  source = _source(name, "train", data_dir)
  return "label" in source[0]


def patchify(images: np.ndarray, patch: int) -> np.ndarray:
  """(N, H, W, C) -> (N, (H/p)*(W/p), p*p*C), row-major over the patch grid."""
  n, h, w, c = images.shape
  if h % patch or w % patch:
    raise DataError(f"image size {h}x{w} is not divisible by the patch size {patch}")
  x = images.reshape(n, h // patch, patch, w // patch, patch, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(n, (h // patch) * (w // patch), patch * patch * c)


def unigram_bits(train: np.ndarray, test: np.ndarray) -> float:
  """Cross-entropy (bits per byte) of the test bytes under the training bytes' unigram
  frequencies (add-one smoothed): the reference an LM must beat."""
  counts = np.bincount(train, minlength=256) + 1.0
  p = counts / counts.sum()
  return float(-np.mean(np.log2(p[test])))
