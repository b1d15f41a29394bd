"""What a project depending on maskprior-jax relies on: one version everywhere, runs that name the
commit of their code, library messages through `logging`, and a SLURM script whose log has a
folder on a fresh clone."""
import importlib.metadata
import logging
import pathlib
import re
import subprocess
import sys

import pytest

import maskprior_jax

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_one_version_everywhere():
  out = subprocess.run([sys.executable, "-m", "maskprior_jax.bench.cli", "--version"], capture_output=True,
                       text=True, timeout=120, check=True).stdout
  assert out.split()[:2] == ["maskprior", importlib.metadata.version("maskprior-jax")]
  assert maskprior_jax.__version__ == importlib.metadata.version("maskprior-jax")
  assert f"## {maskprior_jax.__version__}" in (REPO / "CHANGELOG.md").read_text()


def head_commit():
  """`git rev-parse HEAD` of this checkout (skips the test outside a git checkout)."""
  try:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    pytest.skip("not a git checkout")


def test_the_library_logs_through_its_logger_and_a_user_can_silence_it(caplog):
  from maskprior_jax import train
  logger = logging.getLogger("maskprior_jax")
  level = logger.level
  try:
    with caplog.at_level(logging.INFO, logger="maskprior_jax"):
      train.Progress(10, label="x", every=5).update(5)
    assert [r.name for r in caplog.records] == ["maskprior_jax.train"] and "[x] step 5/10" in caplog.text
    caplog.clear()
    logger.setLevel(logging.ERROR)
    train.Progress(10, label="x", every=5).update(5)
    assert not caplog.records
  finally:
    logger.setLevel(level)


def test_no_print_in_the_library_core():
  """The core reports through `logging` (the `maskprior` command and the benchmarks print their own output)."""
  core = [p for p in (REPO / "maskprior_jax").glob("*.py")]
  offenders = [p.name for p in core if re.search(r"^\s*print\((?!.*file=self\.stream)", p.read_text(), re.M)]
  assert not offenders, offenders


def test_every_sbatch_output_path_has_its_folder_in_a_fresh_checkout():
  tracked = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True).stdout.split()
  if not tracked:
    pytest.skip("not a git checkout")
  folders = {"."} | {str(pathlib.PurePosixPath(p).parent) for p in tracked}
  folders |= {str(pathlib.PurePosixPath(*pathlib.PurePosixPath(f).parts[:i])) for f in list(folders)
              for i in range(1, len(pathlib.PurePosixPath(f).parts))}
  for script in (REPO / "experiments" / "cluster").glob("*.sbatch"):
    paths = re.findall(r"^#SBATCH\s+--(?:output|error)[= ](\S+)", script.read_text(), re.M)
    assert paths, script
    for path in paths:
      assert str(pathlib.PurePosixPath(path).parent) in folders, (script.name, path)


def test_no_lock_files_are_tracked():
  tracked = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True).stdout.split()
  assert not [p for p in tracked if p.endswith(".maskprior.lock")]
