"""`maskprior compile`: the programs a benchmark command would run on a TPU slice, a GPU or this CPU,
traced and compiled here without that device (what MaxText's `train_compile` does for its step).

    maskprior compile boolean --topology h200 --config.model.dtype=bfloat16
    maskprior compile boolean --config boolean_paper --topology v5e-8 --json programs.jsonl

For each benchmark (each Boolean task) and each group of methods that would train as one program
(`runner.method_groups`), the command builds what `maskprior BENCHMARK` with the same arguments
builds: the model, the loop settings, the placement of the runs over the target's devices
(`train.LoopSettings.placement`, decided for those devices: `sharding.for_devices`), the batches
(host or device), the training call (`train.loop_step`) and the evaluation during training
(`runner.evaluation`), with "auto" attention resolved for the target's platform
(`attention.for_platform`). Each is traced, lowered and compiled by the target's compiler (libtpu
for TPUs, XLA's CUDA compiler for GPUs: the `compile` extra), and one line per program says its
runs, devices, FLOPs per step, memory per device against the device's, collectives and compile
time. Not compiled: the one-off programs around the loop (initialisation, qk's fit, the final
metrics). Nothing is trained and no run folder is written.

FLOPs are counted from the traced program (`count_flops`: every matrix product, and the fused
attention kernels by their formula), the same for every target; memory is the compiler's own
figure for the program (`memory_analysis`: arguments + outputs + temporaries - donated buffers).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import re
import sys
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import SingleDeviceSharding

from maskprior_jax import attention, sharding, train
from maskprior_jax.bench import runner
from maskprior_jax.bench.config import UsageError, did_you_mean
from maskprior_jax.bench.flops import count_flops

GiB = 1 << 30

# Target configs for XLA's GPU compiler (GpuTargetConfigProto as text), from NVIDIA's data sheets for
# the SXM parts (Hopper: compute capability 9.0, 132 SMs, 50 MiB L2, 228 KiB shared memory per SM);
# device memory as the driver reports it (81,559 MiB and 143,771 MiB).
_HOPPER = """gpu_device_info {{
  cuda_compute_capability {{ major: 9 minor: 0 }}
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_block_optin: 232448
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth}
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {memory}
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 patch: 0 }}
device_description_str: "{name}"
"""


@dataclasses.dataclass(frozen=True)
class Target:
  """A device kind to compile for. topology: the TPU topology of `jax.experimental.topologies`, or
  the GPU target config; devices: how many of its devices the command runs on (None: all);
  memory: bytes per device; peak: dense FLOP/s by compute dtype (vendor figures, no sparsity;
  float32 as the target computes float32 matrix products by default: one bfloat16 pass on a TPU,
  TF32 on a GPU), for projections only."""
  name: str
  platform: str
  description: str
  topology: str | None
  devices: int | None
  memory: float
  peak: dict[str, float] = dataclasses.field(default_factory=dict)


_H100_MEMORY, _H200_MEMORY = 81559 * (1 << 20), 143771 * (1 << 20)
TARGETS = {
    "cpu": Target("cpu", "cpu", "this machine's CPU devices", None, None, 0.0),
    "v5e-1": Target("v5e-1", "tpu", "one TPU v5e chip (16 GiB HBM)", "v5e:2x2", 1, 16 * GiB,
                    {"bfloat16": 197e12, "float32": 197e12}),
    "v5e-8": Target("v5e-8", "tpu", "a TPU v5e 2x4 slice: 8 chips on 2 hosts (16 GiB each)", "v5e:2x4", None,
                    16 * GiB, {"bfloat16": 197e12, "float32": 197e12}),
    "v6e-8": Target("v6e-8", "tpu", "a TPU v6e 2x4 slice: 8 chips on 2 hosts (32 GiB each)", "v6e:2x4", None,
                    32 * GiB, {"bfloat16": 918e12, "float32": 918e12}),
    "h100": Target("h100", "gpu", "one NVIDIA H100 SXM (80 GB HBM3)",
                   _HOPPER.format(bandwidth=3352000000000, memory=_H100_MEMORY, name="NVIDIA H100 80GB HBM3"), 1,
                   _H100_MEMORY, {"bfloat16": 989e12, "float32": 494e12}),
    "h200": Target("h200", "gpu", "one NVIDIA H200 SXM (141 GB HBM3e)",
                   _HOPPER.format(bandwidth=4800000000000, memory=_H200_MEMORY, name="NVIDIA H200"), 1,
                   _H200_MEMORY, {"bfloat16": 989e12, "float32": 494e12}),
}


class CompileError(RuntimeError):
  """A compiler refused a program (the message names it)."""


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def _host_memory() -> float:
  import os
  return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def target(name: str) -> Target:
  if name not in TARGETS:
    raise UsageError(f"unknown --topology {name!r}{did_you_mean(name, TARGETS)}; use {', '.join(TARGETS)}")
  t = TARGETS[name]
  return dataclasses.replace(t, memory=_host_memory()) if t.platform == "cpu" else t


@functools.lru_cache(maxsize=None)
def target_devices(name: str) -> tuple:
  """The devices of a target, to compile for (no such device needed here)."""
  t = target(name)
  if t.platform == "cpu":
    return tuple(jax.devices("cpu"))
  from jax.experimental import topologies
  if t.platform == "gpu":
    missing = [m for m in ("jax_cuda12_plugin", "nvidia.cudnn") if _missing(m)]
    if missing:
      raise UsageError(f"compiling for {name} needs the CUDA compiler and cuDNN ({', '.join(missing)} not "
                       "installed): pip install 'maskprior-jax[compile]'")
    try:
      devices = topologies.get_topology_desc("", "cuda", target_config=t.topology, topology="1x1x1").devices
    except Exception as e:   # the plugin's own refusal, in one line
      raise UsageError(f"the CUDA compiler could not describe {name}: {_first_line(e)}") from None
  else:
    # Compile-only: no TPU is opened, so several compiling processes may load libtpu at once (it
    # otherwise holds a machine-wide lock file), and nothing asks a cloud metadata server which TPU
    # this host is (off a TPU VM, JAX and libtpu would print a paragraph of warnings about it).
    import os
    for name, value in (("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"), ("TPU_SKIP_MDS_QUERY", "1"),
                        ("TPU_WORKER_HOSTNAMES", "localhost"), ("TPU_ACCELERATOR_TYPE", "v5litepod-4")):
      os.environ.setdefault(name, value)
    if _missing("libtpu"):
      raise UsageError(f"compiling for {name} needs the TPU compiler (libtpu not installed): "
                       "pip install 'maskprior-jax[compile]'")
    try:
      devices = topologies.get_topology_desc(t.topology, "tpu").devices
    except Exception as e:
      raise UsageError(f"the TPU compiler could not describe {t.topology}: {_first_line(e)}") from None
  return tuple(devices[:t.devices] if t.devices else devices)


def _missing(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is None
  except ModuleNotFoundError:
    return True


# -- one benchmark's programs --------------------------------------------------------------------

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


def _collectives(hlo: str) -> dict[str, int]:
  found = {}
  for op in COLLECTIVES:
    n = len(re.findall(rf"^\s*(?:ROOT )?%\S+ = .*? {op}(?:-start)?\(", hlo, re.M))
    if n:
      found[op] = n
  return found


def _abstract(tree, sharding_of):
  """`tree` (arrays or shapes) as ShapeDtypeStructs placed as `sharding_of(leaf)` says."""
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype, sharding=sharding_of(a)), tree)


def _with_run_axis(tree, n: int, axis: int = 0):
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[:axis] + (n,) + a.shape[axis:], a.dtype), tree)


@dataclasses.dataclass
class Program:
  """One compiled program of a command (a row of `maskprior compile`'s output)."""
  benchmark: str
  task: str
  methods: list[str]
  program: str               # "train" (one call: steps_per_call steps) or "eval"
  placement: str
  runs: int                  # runs in the program
  devices: int
  calls_per_step: float      # how often the loop calls it per training step (eval: per eval_every steps)
  flops_per_call: float      # over all its devices
  steps_per_call: int
  memory_per_device: float
  device_memory: float
  collectives: dict
  compile_seconds: float
  attention: str
  dtype: str
  same_as: str = ""          # an earlier program of the command with the same text: not compiled again

  @property
  def fits(self) -> bool:
    return self.memory_per_device <= self.device_memory

  def line(self) -> str:
    what = "train step" if self.program == "train" else "evaluation"
    per = (f"{self.flops_per_call / self.steps_per_call / 1e9:,.2f} GFLOP/step ({self.steps_per_call} steps per call)"
           if self.program == "train" else f"{self.flops_per_call / 1e9:,.2f} GFLOP/call")
    coll = ", ".join(f"{k} x{v}" for k, v in self.collectives.items()) or "no collectives"
    mem = (f"{self.memory_per_device / (1 << 20):,.0f} MiB of {self.device_memory / GiB:,.0f} GiB per device"
           + ("" if self.fits else " DOES NOT FIT"))
    return (f"[{self.benchmark}/{self.task}] {'+'.join(self.methods)} {what}: {self.runs} run{'s' * (self.runs != 1)} on {self.devices} "
            f"device{'s' * (self.devices != 1)} ({self.placement}); {per}; {mem}; {coll}; attention {self.attention}, {self.dtype}; "
            + (f"the same program as {self.same_as}: compiled once" if self.same_as
               else f"compiled in {self.compile_seconds:.1f} s"))


# The programs this process compiled, by the text of their lowered module: a program the same as an
# earlier one (another task of the same shapes, whose data are arguments) is what a run compiles once
# and then reads from its compilation cache. Emptied at each command (`command_programs`): one target.
_COMPILED: dict[tuple, tuple] = {}


def _compile(fn, args, what: str, lowering: str):
  """(FLOPs, memory per device, collectives, compile seconds, cuDNN fused, the earlier program it
  is the same as or "") of `fn` on `args`, compiled for `lowering`."""
  t0 = time.perf_counter()
  try:
    traced = fn.trace(*args)
    met: set[str] = set()   # the walk that counts also says whether cuDNN's kernel is in the step
    flops = count_flops(traced.jaxpr, met)
    fused = any(name.startswith("dot_product_attention_fwd") for name in met)
    lowered = traced.lower(lowering_platforms=(lowering,))
    key = (lowering, hashlib.sha256(lowered.as_text().encode()).hexdigest())
    if key in _COMPILED:
      return (*_COMPILED[key][:3], 0.0, fused, _COMPILED[key][3])
    compiled = lowered.compile()
  except UsageError:
    raise
  except Exception as e:   # the compiler's refusal, named
    raise CompileError(f"{what}: {_first_line(e)}") from None
  seconds = time.perf_counter() - t0
  m = compiled.memory_analysis()
  memory = float(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                 - m.alias_size_in_bytes) if m is not None else float("nan")
  _COMPILED[key] = (flops, memory, _collectives(compiled.as_text() or ""), what)
  return flops, memory, _COMPILED[key][2], seconds, fused, ""


def _lowering(platform: str) -> str:
  return {"gpu": "cuda"}.get(platform, platform)


def _first_device(placement) -> SingleDeviceSharding:
  """The placement's first device: where a run block, or every run without a mesh, lies."""
  return SingleDeviceSharding(sharding.devices()[0] if placement.mesh is None else placement.mesh.devices.flat[0])


def _train_call(loss_fn, tx, states, batches, settings, placement, keys):
  """The loop's compiled call for a placement (`train.loop_step`) and its abstract arguments, laid out
  as the loop lays them (one block's state and batches on its device where runs are stepped in blocks)."""
  mesh, k, spc = placement.mesh, placement.run_block, settings.steps_per_call
  lead = 1 + int(spc > 1)
  first = _first_device(placement)
  state_sharding = None
  if k or mesh is None:
    state_spec = batch_spec = scalar_spec = lambda a: first
  elif placement.mode == "runs":
    state_spec = lambda a: train.run_sharding(mesh)
    batch_spec = lambda a: train.run_sharding(mesh, lead - 1)
    scalar_spec = lambda a: train.replicated(mesh)
  else:
    if settings.fsdp:
      state_sharding = train.fsdp_sharding(states, mesh)
    state_spec = lambda a: train.replicated(mesh)
    batch_spec = lambda a: train.batch_sharding(mesh, lead)
    scalar_spec = lambda a: train.replicated(mesh)
  call = train.loop_step(loss_fn, tx, batches, settings, placement, state_sharding)
  st = (jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), states, state_sharding)
        if state_sharding is not None else _abstract(states, state_spec))
  if isinstance(batches, train.DeviceBatches):
    args = (st, jax.ShapeDtypeStruct((), jnp.int32, sharding=scalar_spec(None)))
    args += (jax.ShapeDtypeStruct((k,), jnp.int32, sharding=first),) if k else ()
    # the training set the draws read (DeviceBatches.data): an argument, on the device or replicated
    return call, args + ((_abstract(batches.data, scalar_spec),) if batches.data is not None else ())
  # the host batches' shapes: one call's batch of the program's runs
  chunk = [batches(j, keys) for j in range(spc)]
  host = jax.tree.map(lambda *xs: np.stack(xs), *chunk) if spc > 1 else chunk[0]
  return call, (st, _abstract(host, batch_spec))


def _eval_specs(placement):
  """How the evaluation's arguments lie (the stacked variables; the data and initial variables) and
  on how many devices it runs."""
  mesh, first = placement.mesh, _first_device(placement)
  if placement.mode == "runs":
    return (lambda a: train.run_sharding(mesh)), (lambda a: train.replicated(mesh)), placement.devices
  if mesh is not None:
    return (lambda a: train.replicated(mesh)), (lambda a: train.replicated(mesh)), placement.devices
  return (lambda a: first), (lambda a: first), 1


def group_programs(bench: runner.Benchmark, methods: Sequence[str], seeds: Sequence[int], tgt: Target,
                   task: str) -> list[Program]:
  """The training call and the evaluation of one group of methods that trains as one program, as
  `runner.train_method` builds them, compiled for `tgt` (call inside `sharding.for_devices`)."""
  methods = list(methods)
  runs = bench.runs(seeds)
  stacked_runs = list(runs) * len(methods)
  n = len(stacked_runs)
  method = bench.method(methods[0])
  model, settings = method.model, method.settings
  tx = settings.optimizer()
  one = jax.eval_shape(lambda k: train.create_state(model.init(k, bench.sample_input), tx, k), jax.random.key(0))
  try:   # a placement the target's devices cannot take, in the run's own words
    placement = settings.placement(n, train.num_params(one.variables))
  except ValueError as e:
    raise UsageError(f"{tgt.name}: {e}") from None
  mesh, k = placement.mesh, placement.run_block
  training = bench.training(method, stacked_runs)
  spc = settings.steps_per_call
  program_runs = k if k else n
  call, args = _train_call(training.loss_fn, tx, _with_run_axis(one, program_runs), training.batches, settings,
                           placement, [r.key for r in stacked_runs][:program_runs])
  used = 1 if (k or mesh is None) else placement.devices
  label = f"{bench.name} {'+'.join(methods)}"
  lowering = _lowering(tgt.platform)
  dtype = bench.cfg.model.get("dtype", "float32")
  flops, memory, coll, secs, fused, same = _compile(call, args, f"{label} train step", lowering)
  # The path the program took: cuDNN's fused kernel where it is in the traced step, else XLA's (or blockwise).
  impl = "cudnn" if fused else "blockwise" if bench.cfg.model.attention == "blockwise" else "xla"
  common = dict(benchmark=bench.kind, task=task, methods=methods, placement=placement.describe(), devices=used,
                device_memory=tgt.memory, attention=impl, dtype=dtype)
  rows = [Program(program="train", runs=program_runs, calls_per_step=(n // program_runs) / spc, flops_per_call=flops,
                  steps_per_call=spc, memory_per_device=memory, collectives=coll, compile_seconds=secs, same_as=same,
                  **common)]
  # The evaluation during training, on the joined state of every run.
  eval_all, data = runner.evaluation(method, training, mesh), training.eval_data
  var_spec, rest_spec, eval_devices = _eval_specs(placement)
  variables = _with_run_axis(one.variables, n)
  eval_args = (_abstract(variables, var_spec), None if data is None else _abstract(data, rest_spec),
               _abstract(variables, rest_spec), *_abstract(runner.probe_arguments(method.probe), rest_spec))
  flops, memory, coll, secs, _, same = _compile(eval_all, eval_args, f"{label} evaluation", lowering)
  every = settings.eval_every or settings.steps
  rows.append(Program(program="eval", runs=n, calls_per_step=1.0 / every, flops_per_call=flops, steps_per_call=1,
                      memory_per_device=memory, collectives=coll, compile_seconds=secs, same_as=same,
                      **{**common, "devices": eval_devices}))
  return rows


def benchmark_programs(bench: runner.Benchmark, methods: Sequence[str], seeds: Sequence[int], tgt: Target,
                       task: str, log=print) -> list[Program]:
  """Every program of one benchmark's run, by method group (`runner.method_groups`)."""
  rows = []
  for group in runner.method_groups(bench, {m: list(seeds) for m in methods}):
    for row in group_programs(bench, group, seeds, tgt, task):
      log(row.line())
      rows.append(row)
  return rows


def command_programs(command: runner.Command, cfg, context, methods, seeds, tgt: Target, log=print) -> list[Program]:
  """Every program of a benchmark command (`runner.Command.benchmarks`), compiled for `tgt`."""
  if command.benchmarks is None:
    raise UsageError(f"maskprior compile: the {command.name} benchmark does not list its programs")
  _COMPILED.clear()
  rows = []
  for task, bench in command.benchmarks(cfg, context, seeds):
    rows += benchmark_programs(bench, methods, seeds, tgt, task, log=log)
  return rows


def for_target(name: str):
  """The context in which programs are built for target `name`: its devices and platform."""
  import contextlib
  devices = target_devices(name)
  stack = contextlib.ExitStack()
  stack.enter_context(sharding.for_devices(devices))
  stack.enter_context(attention.for_platform(target(name).platform))
  return stack


def record(row: Program, tgt: Target, config: str, argv: Sequence[str]) -> dict:
  """One JSON line: the program's figures, its target and the command."""
  steps_flops = row.flops_per_call / row.steps_per_call if row.program == "train" else row.flops_per_call
  return {"target": tgt.name, "target_description": tgt.description, "platform": tgt.platform,
          "benchmark": row.benchmark, "task": row.task, "config": config, "dtype": row.dtype,
          "attention": row.attention, "methods": row.methods, "program": row.program, "placement": row.placement,
          "runs": row.runs, "devices": row.devices, "steps_per_call": row.steps_per_call,
          "calls_per_step": row.calls_per_step, "flops_per_call": row.flops_per_call,
          "flops": steps_flops, "memory_per_device": row.memory_per_device, "device_memory": tgt.memory,
          "fits": row.fits, "compiled": True, "collectives": row.collectives,
          "compile_seconds": round(row.compile_seconds, 2), "command": " ".join(["maskprior", "compile", *argv]),
          **({"same_as": row.same_as} if row.same_as else {})}


def add_parser(sub, benchmarks, command_of, benchmark_flags, epilog: str, config_of) -> None:
  """The `maskprior compile BENCHMARK` subcommands (`bench.cli`): each benchmark's own flags
  (`benchmark_flags`), --topology and --json; `config_of(args)` is the command's config."""
  import argparse
  c = sub.add_parser("compile", help="compile a benchmark's programs for a TPU slice, a GPU or this CPU, without "
                     "the device", description="Traces and compiles the training and evaluation programs that "
                     "`maskprior BENCHMARK` with the same flags would run on --topology, here, and prints one line "
                     "per program (runs, devices, FLOPs per step, memory per device, collectives, compile time). "
                     "TPU and GPU targets need the compile extra: pip install 'maskprior-jax[compile]'.")
  csub = c.add_subparsers(dest="benchmark", required=True)
  for name in benchmarks:
    p = csub.add_parser(name, help=f"compile {name}'s programs", epilog=epilog,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    benchmark_flags(p, name, command_of(name))
    p.add_argument("--topology", default="cpu", choices=list(TARGETS), metavar="TOPOLOGY",
                   help=f"what to compile for: {', '.join(f'{k} ({t.description})' for k, t in TARGETS.items())} "
                   "(default: %(default)s)")
    p.add_argument("--json", help="append one JSON line per program to this file (default: print only)")
    p.set_defaults(fn=lambda args: cmd_compile(args, command_of(args.benchmark), config_of(args)))


def cmd_compile(args, command, cfg) -> int:
  """`maskprior compile BENCHMARK ...`: every program printed (and with --json, appended as JSON
  lines); exit status 1 where a program does not fit its device's memory."""
  from maskprior_jax.bench.args import parse_list, parse_seeds
  jax.config.update("jax_platforms", "cpu")   # compile-only: this process's CPU, whatever device it has
  methods, seeds = parse_list(args.methods, command.methods, "method"), parse_seeds(args.seeds)
  tgt = target(args.topology)
  print(f"compiling for {tgt.name}: {tgt.description}", file=sys.stderr)
  with for_target(tgt.name):
    _, context = command.prepare(args, cfg, methods)
    try:
      rows = command_programs(command, cfg, context, methods, seeds, tgt)
    except CompileError as e:
      raise UsageError(f"the {tgt.name} compiler refused {e}") from None
  config = args.config or "default"
  if args.json:
    from maskprior_jax.bench import workdir as workdir_lib
    path = workdir_lib.path(args.json)
    lines = "".join(json.dumps(record(r, tgt, config, args.argv[1:])) + "\n" for r in rows)
    with open(path, "a") as f:
      f.write(lines)
  over = [r for r in rows if not r.fits]
  print(f"{len(rows)} programs for {tgt.name}, {sum(not r.same_as for r in rows)} compiled; "
        + (f"{len(over)} do not fit the device's memory" if over else "every one fits the device's memory"))
  print(totals(rows, tgt, cfg.train.steps))
  return 1 if over else 0


def totals(rows: Sequence[Program], tgt: Target, steps: int) -> str:
  """The command's totals in one line: programs, compile time, the largest memory per device, the
  FLOPs of the whole command (its training calls for `steps` steps and its evaluations, counted as
  `projection` counts them), and its projected compute time at 45% to 10% of the target's peak
  beside the compile time."""
  compile_s = sum(r.compile_seconds for r in rows)
  recs = [record(r, tgt, "", []) for r in rows]
  flop = sum((r["calls_per_step"] * steps + (r["program"] == "eval")) * r["flops_per_call"] for r in recs)   # as projection()
  distinct = sum(not r.same_as for r in rows)
  line = (f"totals: {len(rows)} programs, {distinct} of them distinct (a run compiles each once), "
          f"{compile_s / 60:.1f} min of compiling on this CPU; "
          f"at most {max((r.memory_per_device for r in rows), default=0) / GiB:,.2f} GiB per device; "
          f"{flop / 1e15:,.3f} PFLOP for {steps} steps with its evaluations")
  dtypes = {r.dtype for r in rows}
  peak = tgt.peak.get(dtypes.pop()) if len(dtypes) == 1 else None
  if peak:
    fast, slow = (projection(recs, steps, mfu, peak) / 60 for mfu in (0.45, 0.10))
    line += f"; compute about {fast:,.1f} to {slow:,.1f} min at 45% to 10% of its peak, beside {compile_s / 60:.1f} min of compiling"
  return line


def projection(rows: Sequence[dict], steps: int, mfu: float, peak: float) -> float:
  """Projected wall seconds of a command from its programs' JSON lines (`record`): every group's
  training calls for `steps` steps and its evaluations, at `mfu` of `peak` FLOP/s per device used.
  The groups run one after another, as the runner runs them."""
  seconds = 0.0
  for r in rows:
    calls = r["calls_per_step"] * steps + (1 if r["program"] == "eval" else 0)
    seconds += calls * r["flops_per_call"] / (r["devices"] * peak * mfu)
  return seconds


__all__ = ["TARGETS", "Target", "CompileError", "Program", "count_flops", "target", "target_devices", "for_target",
           "group_programs", "benchmark_programs", "command_programs", "add_parser", "cmd_compile", "record",
           "projection", "totals"]
