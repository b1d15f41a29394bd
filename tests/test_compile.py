"""Accelerator programs checked on this CPU: the runs' programs traced and compiled for a GPU (XLA's
CUDA compiler) and a TPU slice (libtpu) without the device (`maskprior compile`), cuDNN attention
with stacked runs, bfloat16 models from the config, and the FLOP count. The GPU and TPU tests need the
compile extra (`pip install ".[compile]"`) and are skipped without it; .ci/run installs it and runs
this file as its last step."""
import importlib.util
import json
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from cli_args import SMALL_BOOLEAN

from maskprior_jax import priors, train
from maskprior_jax.attention import MaskSettings, for_platform
from maskprior_jax.bench import compile as compile_lib
from maskprior_jax.models import Transformer


def _have(module):
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:
    return False


needs_cuda = pytest.mark.skipif(not (_have("jax_cuda12_plugin") and _have("nvidia.cudnn")),
                                reason="the compile extra (jax-cuda12-plugin, nvidia-cudnn-cu12) is not installed")
needs_tpu = pytest.mark.skipif(not _have("libtpu"), reason="the compile extra (libtpu) is not installed")


def _model(dtype=jnp.bfloat16, implementation="cudnn", depth=2):
  return Transformer(vocab_size=2, dim=64, depth=depth, num_heads=4, head_dim=16, mlp_dim=128, max_len=15,
                     mask=MaskSettings(priors.from_matrix(np.zeros((4, 16, 16), np.float32))), dtype=dtype,
                     attention_implementation=implementation)


def _stacked_step(model, runs=4, batch=16):
  """The runner's way of stacking seeds: `make_train_step(seed_axis=True)` over `runs` runs, each with
  its own prior (abstract state and batch)."""
  one = jax.eval_shape(lambda k: model.clone(attention_implementation="xla").init(k, jnp.zeros((batch, 15), jnp.int32)),
                       jax.random.key(0))

  def loss_fn(variables, b, rng):
    return jnp.mean((model.apply(variables, b["x"]) - b["y"]) ** 2), {}
  tx = optax.adam(1e-3)
  state = jax.eval_shape(lambda v: train.stack_trees([train.create_state(v, tx, jax.random.key(s)) for s in range(runs)]),
                         one)
  b = {"x": jax.ShapeDtypeStruct((runs, batch, 15), jnp.int32), "y": jax.ShapeDtypeStruct((runs, batch), jnp.float32)}
  return train.make_train_step(loss_fn, tx, seed_axis=True), state, b


@needs_cuda
def test_bfloat16_stacked_runs_with_cudnn_lower_for_cuda_with_the_fused_forward_and_backward():
  """The bug this guards: JAX's batching rule for the fused kernel reshaped a per-run prior as if it
  carried the example batch ("cannot reshape array of shape (4, 1, 4, 16, 16) into (64, 4, 16, 16)").
  Now the stacked program lowers for CUDA with cuDNN's fused calls, forward and backward, in every layer."""
  step, state, batch = _stacked_step(_model())
  text = step.trace(state, batch).lower(lowering_platforms=("cuda",)).as_text()
  calls = re.findall(r"__cudnn\$fmha\w+", text)
  assert calls.count("__cudnn$fmhaScaleBiasSoftmaxBackward") == 2          # one per layer, all 4 runs in it
  assert calls.count("__cudnn$fmhaScaleBiasSoftmax") >= 2
  # "auto" picks the same path for a GPU while tracing on this CPU, and XLA's for a CPU.
  with for_platform("gpu"):
    auto = _stacked_step(_model(implementation="auto"))
    assert "__cudnn$fmhaScaleBiasSoftmaxBackward" in auto[0].trace(*auto[1:]).lower(lowering_platforms=("cuda",)).as_text()
  cpu = _stacked_step(_model(implementation="auto"))
  assert "cudnn" not in cpu[0].trace(*cpu[1:]).lower().as_text()


def test_flop_count_equals_a_hand_count_of_the_transformer_step():
  """`count_flops` over one training step (forward and backward: 3x the forward's matrix products)
  against the Boolean default model's formula, per example and layer: q, k, v and out projections
  8*T*d*(N*H), the two attention products 4*T*T*N*H, the MLP 4*T*d*m; the head 2*d."""
  B, T, d, N, H, m, depth = 16, 16, 64, 4, 16, 128, 2
  step, state, batch = _stacked_step(_model(jnp.float32, "xla", depth), runs=1, batch=B)
  got = compile_lib.count_flops(step.trace(state, batch).jaxpr)
  per_layer = 8 * T * d * N * H + 4 * T * T * N * H + 4 * T * d * m
  hand = 3 * B * (depth * per_layer + 2 * d)
  assert abs(got - hand) / hand < 0.02, (got, hand)


def _compile_cli(*args, timeout=900):
  out = subprocess.run([sys.executable, "-m", "maskprior_jax.bench.cli", "compile", *args], capture_output=True,
                       text=True, timeout=timeout)
  return out


def _rows(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


@needs_cuda
def test_maskprior_compile_for_a_gpu_builds_the_boolean_defaults_programs(tmp_path):
  """`maskprior compile boolean --topology h200 --config.model.dtype=bfloat16` (the Boolean default's
  model): the programs the run would build (vanilla and qk stacked, mask alone; each a training call
  and an evaluation), cuDNN attention for bfloat16 on a GPU (the stacked runs' per-run prior included),
  every run of a group in one program on the one device, within its memory."""
  out = _compile_cli("boolean", "--task", "f2", "--methods", "vanilla,qk,mask", "--seeds", "2", "--topology", "h200",
                     "--config.model.dtype=bfloat16", "--json", str(tmp_path / "p.jsonl"))
  assert out.returncode == 0, out.stderr[-2000:]
  rows = _rows(tmp_path / "p.jsonl")
  assert [(r["methods"], r["program"]) for r in rows] == [
      (["vanilla", "qk"], "train"), (["vanilla", "qk"], "eval"), (["mask"], "train"), (["mask"], "eval")]
  assert {r["attention"] for r in rows} == {"cudnn"} and {r["dtype"] for r in rows} == {"bfloat16"}
  assert [r["runs"] for r in rows] == [4, 4, 2, 2] and all(r["fits"] and r["devices"] == 1 for r in rows)
  assert all(r["flops"] > 0 and 0 < r["memory_per_device"] < r["device_memory"] for r in rows)
  assert "4 programs for h200, 4 compiled; every one fits" in out.stdout
  total = next(line for line in out.stdout.splitlines() if line.startswith("totals: 4 programs, 4 of them distinct"))
  assert "min of compiling on this CPU" in total and "at 45% to 10% of its peak" in total, total


@needs_tpu
def test_maskprior_compile_for_a_tpu_slice_places_runs_as_the_run_would(tmp_path):
  """A v5e 2x4 slice (8 chips, 2 hosts): 8 runs go one per chip over the runs mesh, with no collective;
  3 runs do not split over the chips and train data-parallel, with the gradient's all-reduce. On the
  tests' small Boolean model: where runs go depends on the run count, the hosts and whether a run is
  under `placement.RUNS_MAX_PARAMS` parameters, which the default model is too (the default model's
  programs are compiled for a GPU above, and the paper-size one below)."""
  for seeds in ("8", "3"):
    out = _compile_cli("boolean", "--task", "f2", "--methods", "mask", "--seeds", seeds, "--topology", "v5e-8",
                       "--json", str(tmp_path / "p.jsonl"), *SMALL_BOOLEAN)
    assert out.returncode == 0, out.stderr[-2000:]
  train8, _, train3, _ = _rows(tmp_path / "p.jsonl")
  assert train8["placement"].startswith("run-parallel: 8 runs over 8 devices") and train8["collectives"] == {}
  assert train3["placement"].startswith("data-parallel") and train3["collectives"].get("all-reduce", 0) >= 1
  assert train8["fits"] and train3["fits"]


@pytest.mark.skipif(not (_have("libtpu") and _have("jax_cuda12_plugin") and _have("nvidia.cudnn")),
                    reason="the compile extra is not installed")
@pytest.mark.parametrize("topology,dtype", [("h100", "bfloat16")])
def test_the_paper_size_boolean_program_compiles_and_fits_one_chip(tmp_path, topology, dtype):
  """GOTU's model (boolean_paper: dim 256, depth 12, batch 256), mask runs stacked, for one H100 in
  bfloat16 (cuDNN attention): both programs compile and fit, at about 160 GFLOP per run and step.
  Compiled once, for the GPU: the TPU compiler is checked on the tests' small model's programs above."""
  out = _compile_cli("boolean", "--config", "boolean_paper", "--task", "f2", "--methods", "mask", "--seeds", "2",
                     "--topology", topology, f"--config.model.dtype={dtype}", "--json", str(tmp_path / "p.jsonl"))
  assert out.returncode == 0, out.stderr[-2000:]
  train, evaluation = _rows(tmp_path / "p.jsonl")
  assert train["runs"] == 2 and train["fits"] and evaluation["fits"]
  assert 1.5e11 < train["flops"] / 2 < 1.7e11
  assert train["attention"] == ("cudnn" if topology == "h100" else "xla")


def test_compile_refuses_an_unknown_target_in_one_line():
  out = _compile_cli("boolean", "--task", "f2", "--topology", "h300")
  assert out.returncode == 2 and "invalid choice: 'h300'" in out.stderr
  with pytest.raises(compile_lib.UsageError, match="did you mean h100"):
    compile_lib.target("h10")


def test_projection_adds_every_programs_calls():
  rows = [{"program": "train", "calls_per_step": 0.5, "flops_per_call": 4e12, "devices": 1},
          {"program": "eval", "calls_per_step": 0.01, "flops_per_call": 1e12, "devices": 1}]
  # 1,000 steps: 500 train calls (2e15) and 11 evaluations (1.1e13), at half of 1e15 FLOP/s
  assert compile_lib.projection(rows, 1000, 0.5, 1e15) == pytest.approx((2e15 + 1.1e13) / 5e14)



@pytest.mark.skipif(_have("jax_cuda12_plugin") and _have("nvidia.cudnn"), reason="the compile extra is installed")
def test_without_the_compile_extra_a_gpu_target_names_the_extra_in_one_line():
  out = _compile_cli("boolean", "--task", "f2", "--topology", "h100")
  assert out.returncode == 2
  assert out.stderr.strip().splitlines()[-1] == (
      "maskprior: error: compiling for h100 needs the CUDA compiler and cuDNN (" + ", ".join(
          m for m in ("jax_cuda12_plugin", "nvidia.cudnn") if not _have(m)) + " not installed): "
      "pip install 'maskprior-jax[compile]'")


@pytest.mark.skipif(not _have("jax_cuda12_plugin"), reason="runs in CI's compile step (with the compile extra)")
def test_tasks_of_one_shape_are_one_program_compiled_once(tmp_path):
  """The Boolean headline's default sizes on this CPU: f1, f2 and f4 (n = 15) take their data as
  arguments, so f2's and f4's programs are f1's, compiled once and said so; f3 (n = 10) and frozen
  coordinate (n = 12) have programs of their own."""
  out = _compile_cli("boolean", "--methods", "vanilla", "--seeds", "1", "--topology", "cpu", *SMALL_BOOLEAN,
                     "--json", str(tmp_path / "p.jsonl"))
  assert out.returncode == 0, out.stderr[-2000:]
  rows = _rows(tmp_path / "p.jsonl")
  same = {(r["task"], r["program"]): r.get("same_as", "") for r in rows}
  for task in ("f2_2parity", "f4_majority"):
    assert same[(task, "train")] == "f1_threesym vanilla train step", same
    assert same[(task, "eval")] == "f1_threesym vanilla evaluation", same
  assert not any(same[(t, p)] for t in ("f1_threesym", "f3_cyclic", "frozen_coordinate") for p in ("train", "eval"))
  assert "10 programs for cpu, 6 compiled;" in out.stdout
  assert "totals: 10 programs, 6 of them distinct" in out.stdout
  assert all(r["compile_seconds"] == 0 for r in rows if r.get("same_as"))
