"""Vision and language benchmarks: embedded data, the TFDS path on datasets built here
offline (array_record, read through tfds.data_source, exactly the code real datasets use),
and the missing-dataset error."""
import json

import numpy as np
import pytest
from cli_args import ONE_DEVICE, SMALL_MODEL

from maskprior_jax.bench import cli
from maskprior_jax.bench import data as D

SHORT_DEFAULT_MODEL = ["--config.train.steps=50", "--config.train.steps_per_call=25", "--config.eval.every_steps=25",
                       "--config.qk.fit_steps=10", "--config.eval.probe_size=8"]
SHORT = [*SHORT_DEFAULT_MODEL, *SMALL_MODEL, *ONE_DEVICE]


_BUILDERS = []


def _builders(tfds, PIL):
  """Two tiny TFDS datasets, built here offline (the classes need tensorflow_datasets). Defined once
  per process: TFDS registers a builder class by name, and a second definition is an error (the
  notebook test builds the image dataset too, in the same slow-step worker)."""
  if not _BUILDERS:
    _BUILDERS.extend(_define_builders(tfds, PIL))
  return tuple(_BUILDERS)


def _define_builders(tfds, PIL):
  class MaskpriorTinyImages(tfds.core.GeneratorBasedBuilder):
    """Three classes of 8x8 grey images: a bright row, column or diagonal."""
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          "image": tfds.features.Image(shape=(8, 8, 1)), "label": tfds.features.ClassLabel(num_classes=3)}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples(96, 0), "test": self._generate_examples(30, 1)}

    def _generate_examples(self, n, seed):
      rng = np.random.default_rng(seed)
      for i in range(n):
        img = rng.integers(0, 60, (8, 8)).astype(np.uint8)
        label, k = i % 3, rng.integers(0, 8)
        if label == 0:
          img[k] = 255
        elif label == 1:
          img[:, k] = 255
        else:
          img[np.arange(8), np.arange(8)] = 255
        yield i, {"image": PIL.fromarray(img), "label": label}


  class MaskpriorTinyText(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples(0), "test": self._generate_examples(1)}

    def _generate_examples(self, seed):
      words = ["mask", "prior", "attention", "bias", "head", "layer"]
      rng = np.random.default_rng(seed)
      for i in range(20):
        yield i, {"text": " ".join(rng.choice(words, 40))}
  return MaskpriorTinyImages, MaskpriorTinyText


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """TFDS-only tests need tensorflow_datasets and PIL (the `data` extra); the embedded-data tests
  below do not, and run without them."""
  tfds = pytest.importorskip("tensorflow_datasets")
  PIL = pytest.importorskip("PIL.Image")
  d = tmp_path_factory.mktemp("tfds")
  for cls in _builders(tfds, PIL):
    cls(data_dir=str(d), file_format="array_record").download_and_prepare()
  return d


@pytest.mark.slow   # CI's slow step
@pytest.mark.xdist_group("tfds")
def test_tfds_images_load_through_data_source(data_dir):
  ds = D.tfds_images("maskprior_tiny_images", data_dir=str(data_dir))
  assert ds.train_x.shape == (96, 8, 8, 1) and ds.test_x.shape == (30, 8, 8, 1)
  assert ds.num_classes == 3 and ds.train_x.max() == 1.0
  host1 = D.tfds_images("maskprior_tiny_images", data_dir=str(data_dir), process_index=1, process_count=2)
  np.testing.assert_array_equal(host1.train_y, ds.train_y[1::2])    # each host reads its share


@pytest.mark.slow   # CI's slow step
@pytest.mark.xdist_group("tfds")
def test_vision_trains_on_a_tfds_dataset(data_dir, tmp_path):
  work = tmp_path / "v"
  rc = cli.main(["vision", "--dataset", "maskprior_tiny_images", "--data-dir", str(data_dir), "--methods",
                 "vanilla,mask", "--seeds", "2", "--workdir", str(work), *SHORT])
  assert rc == 0
  res = json.loads((work / "results.json").read_text())
  assert res["dataset"] == "maskprior_tiny_images" and res["grid"] == [4, 4]
  assert {(r["method"], r["seed"]) for r in res["runs"]} == {(m, s) for m in ("vanilla", "mask") for s in (0, 1)}
  assert all(0 <= r["test_accuracy"] <= 1 for r in res["runs"])
  assert (work / "table.md").exists() and (work / "persistence.png").exists()


@pytest.mark.slow   # CI's slow step
@pytest.mark.xdist_group("tfds")
def test_language_trains_on_a_tfds_text_dataset(data_dir, tmp_path):
  work = tmp_path / "l"
  rc = cli.main(["language", "--dataset", "maskprior_tiny_text", "--data-dir", str(data_dir), "--methods", "mask",
                 "--seeds", "1", "--workdir", str(work), "--config.data.seq_len=32", *SHORT_DEFAULT_MODEL])
  assert rc == 0
  res = json.loads((work / "results.json").read_text())
  run = res["runs"][0]
  assert run["test_bits_per_char"] == pytest.approx(np.log2(run["test_perplexity"]))
  assert run["test_bits_per_char"] < res["unigram_bits_per_char"]    # six repeated words are easy


def test_missing_dataset_is_a_one_line_error(tmp_path, capsys):
  pytest.importorskip("tensorflow_datasets")
  rc = cli.main(["vision", "--dataset", "cifar10", "--data-dir", str(tmp_path / "empty"),
                 "--workdir", str(tmp_path / "w"), *SHORT])
  assert rc == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "tfds build cifar10" in err[0] and "--data-dir" in err[0]


def test_embedded_defaults():
  d = D.digits()
  assert d.train_x.shape == (1438, 8, 8, 1) and d.test_x.shape == (359, 8, 8, 1)
  t = D.pydoc_text()
  assert len(t.train) + len(t.test) > 400_000
  assert 4.0 < D.unigram_bits(t.train, t.test) < 5.5


@pytest.mark.slow   # CI's slow step
def test_digits_and_pydoc_short_runs(tmp_path):
  for kind in ("vision", "language"):
    work = tmp_path / kind
    assert cli.main([kind, "--methods", "vanilla,qk", "--seeds", "1", "--workdir", str(work),
                     *SHORT]) == 0
    res = json.loads((work / "results.json").read_text())
    assert [r["method"] for r in res["runs"]] == ["vanilla", "qk"]
    qk = next(r for r in res["runs"] if r["method"] == "qk")
    van = next(r for r in res["runs"] if r["method"] == "vanilla")
    # the fitted QK initialization starts closer to the prior's pattern than vanilla does
    assert np.mean(qk["persistence"][0]["attn_tv"]) < np.mean(van["persistence"][0]["attn_tv"])


def test_controls_zero_bias_learns_and_alibi_stays_fixed(tmp_path):
  """bias_zero: the mask model's bias, initialised at zero, trains; alibi: the prior's slopes as a
  fixed bias, bit for bit unchanged by training. Controls run only when named."""
  from maskprior_jax.bench.language import run as language_run
  work = tmp_path / "language"
  assert cli.main(["language", "--methods", "bias_zero,alibi", "--seeds", "1", "--workdir", str(work), *SHORT]) == 0
  res = json.loads((work / "results.json").read_text())
  drift = {r["method"]: [p["mask_drift"] for p in r["persistence"]] for r in res["runs"]}
  assert drift["alibi"][0] == 0 and all(d == 0 for d in drift["alibi"])
  assert drift["bias_zero"][-1] > 0
  assert cli.main(["vision", "--methods", "alibi", "--workdir", str(tmp_path / "v")]) == 2   # language only
  assert language_run.COMMAND.default_methods == ("vanilla", "mimetic", "qk", "mask")
  assert "alibi" in language_run.COMMAND.methods
