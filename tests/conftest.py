"""The test session's setup: 8 host devices, one XLA compilation cache, and run folders built once.

Which marker a test belongs under (README, "Tests"; docs/contributing.md):
- no marker (the default suite, the README's test command, about 5 minutes on 2 cores): library
  behaviour on small arrays, and whole commands at the smallest size that still shows what the test
  asserts. A test that only reads a finished run folder takes `shared_run` instead of training its own.
- ``slow`` (CI's slow step): several processes, kill-and-resume pairs, the bfloat16 fit, the cloud
  emulator, and whole-run equivalences that need two full commands each.
- ``notebook``: the Colab notebooks, executed in smoke mode (CI runs them with the slow step).
"""
import fcntl
import json
import os
import subprocess
import sys
import tempfile

import pytest

# How XLA compiles for the tests (cli_args.TEST_XLA: less optimised machine code, quicker to
# compile), then several host devices, so multi-device code is exercised on CPU. Must be set before
# JAX starts; the commands the tests start inherit it or take cli_args.xla_flags().
from cli_args import TEST_XLA  # noqa: E402

_flags = os.environ.get("XLA_FLAGS", "")
_flags = [f for f in TEST_XLA.split() if f.split("=")[0] not in _flags] + _flags.split()
if not any(f.startswith("--xla_force_host_platform_device_count=") for f in _flags):
  _flags.insert(0, "--xla_force_host_platform_device_count=8")
os.environ["XLA_FLAGS"] = " ".join(_flags)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One XLA compilation cache for the whole session: this process, pytest-xdist's workers (started
# after this file is read, so they inherit it) and the command-line runs tests start. The
# end-to-end tests compile the same programs (the same models, steps and evaluations) many times;
# a cached executable is the same compiled program, so nothing a test compares changes. Every
# program is cached, however quick its compile: a command-line run compiles about 200 small ones
# (operations run outside jit), together about as long as its training program.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="maskprior-tests-xla-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory, request):
  """``shared_run(name, args, env=None)``: the run folder of ``maskprior ARGS``, built once per
  pytest run and shared by every test and every pytest-xdist worker that asks for the same name and
  arguments (the first to ask builds it under a file lock; the others wait and read it). In this
  process, or with ``env`` as a command of its own under that environment (its XLA_FLAGS are part of
  what must agree). Tests read it and must not write into it: a test that changes a folder copies it
  first."""
  from maskprior_jax.bench import cli
  root = tmp_path_factory.getbasetemp()
  if hasattr(request.config, "workerinput"):   # a pytest-xdist worker: its base folder lies in the run's one
    root = root.parent
  root = root / "shared_runs"
  root.mkdir(exist_ok=True)

  def get(name: str, args: list[str], env: dict | None = None):
    work = root / name
    asked = [*args, *([] if env is None else ["XLA_FLAGS=" + env.get("XLA_FLAGS", "")])]
    with open(root / f"{name}.lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      record = root / f"{name}.args.json"
      if record.exists():
        if json.loads(record.read_text()) != asked:
          raise AssertionError(f"shared run {name!r} asked for with other arguments")
      else:
        if env is None:
          assert cli.main([*args, "--workdir", str(work)]) == 0, args
        else:
          out = subprocess.run([sys.executable, "-m", "maskprior_jax.bench.cli", *args, "--workdir", str(work)],
                               env=env, capture_output=True, text=True, timeout=900)
          assert out.returncode == 0, out.stderr[-3000:]
        record.write_text(json.dumps(asked))
    return work
  return get

