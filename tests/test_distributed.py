import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from cli_args import free_port, xla_flags

WORKER = pathlib.Path(__file__).with_name("distributed_worker.py")


def _env(devices):
  return {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_ENABLE_X64": "1",
          "XLA_FLAGS": xla_flags(devices)}


@pytest.mark.slow   # two processes; the whole-run form is tests/test_multiprocess.py
def test_two_processes_agree_with_one(tmp_path):
  ref = tmp_path / "ref.json"
  subprocess.run([sys.executable, str(WORKER), str(ref)], env=_env(4), check=True, timeout=300,
                 capture_output=True)
  out = tmp_path / "two.json"
  coord = f"127.0.0.1:{free_port()}"
  procs = [subprocess.Popen([sys.executable, str(WORKER), str(out), coord, "2", str(i)], env=_env(2),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
  for p in procs:
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-2000:]
  a, b = json.loads(ref.read_text()), json.loads(out.read_text())
  assert a["processes"] == 1 and b["processes"] == 2 and a["devices"] == b["devices"] == 4
  np.testing.assert_allclose(b["losses"], a["losses"], rtol=1e-5)
  for x, y in zip(a["leaves"], b["leaves"]):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-4, atol=1e-6)


def test_take_part_shares_cover_the_batch_in_order():
  """Host batch functions build share i of n of a global batch's rows (each process its own);
  the shares, in process order, are the whole batch, and a batch that does not divide is refused."""
  from maskprior_jax import distributed
  rows = np.arange(12) * 10
  for n in (1, 2, 3, 4):
    parts = [distributed.take_part(rows, (i, n)) for i in range(n)]
    assert np.concatenate(parts).tolist() == rows.tolist()
  assert distributed.take_part(rows).tolist() == rows[distributed.process_slice(12)].tolist()
  with np.testing.assert_raises_regex(ValueError, "not divisible by 5 processes"):
    distributed.take_part(rows, (0, 5))


def test_without_a_cluster_auto_stays_one_process_and_on_or_off_say_why():
  """No cluster variables: --distributed auto stays a single process; on is a one-line error; off
  with a coordinator is an error; JAX's detection sees SLURM's variables."""
  env = {k: v for k, v in _env(1).items() if not k.startswith(("SLURM_", "MASKPRIOR_", "OMPI_", "TPU_"))}
  code = ("from maskprior_jax import distributed as d; import jax; print(d.initialize(mode='auto'), jax.process_count())")
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
  assert out.stdout.strip() == "single process 1"
  from maskprior_jax import distributed
  with pytest.raises(ValueError, match="recognises no cluster"):
    distributed.initialize(mode="on") if distributed.detect_cluster() is None else pytest.skip("a cluster is here")
  with pytest.raises(ValueError, match="--distributed off"):
    distributed.initialize("127.0.0.1:1234", 2, 0, mode="off")
  slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "1", "SLURM_PROCID": "0",
           "SLURM_LOCALID": "0"}
  code = "from maskprior_jax import distributed as d; print(d.detect_cluster())"
  out = subprocess.run([sys.executable, "-c", code], env={**env, **slurm}, capture_output=True, text=True, timeout=120)
  assert out.stdout.strip() == "slurm"
