"""Command-line pieces shared by the tests that run whole `maskprior boolean` commands (resume,
faults, several processes, the CLI's own behaviour): what they check (bit-identical resume, layouts,
crash recovery, files and messages) does not depend on the model's size, so they train a small model
(SMALL_MODEL) and, where no test reads the whole cube's degree profile, evaluate on a sample of the
cube (SMALL_BOOLEAN), which halves each command's compile and run time. Commands whose subject is not
where runs go add ONE_DEVICE: with the suite's 8 host devices, "auto" spreads a method's runs over
them, and JAX keys a CPU program by its device (in memory and in its compilation cache), so the
one-run program is compiled once per device (8 compiles of about 2.7 s for the arithmetic end-to-end
run, half of its time). Where runs go is the subject of test_run_parallel, test_optim_train and
test_multiprocess; test_stack_methods keeps its stacked methods spread over the devices.
`free_port()`: a port on 127.0.0.1 that nothing listens on, for a coordinator or an emulator the
tests start. `xla_flags(devices)`: the XLA_FLAGS a command the tests start runs with (see TEST_XLA)."""
import os
import socket

# How the tests have XLA compile (tests/conftest.py sets it for this process and everything it
# starts; commands get it from xla_flags()): LLVM's optimisation off and one thread per CPU
# operation. The suite is compile-bound: on 2 cores the default suite took 4:19 (485 CPU seconds)
# against 5:04 (578) under XLA's defaults, one run each on one machine within the hour. Neither
# setting changes what a program means, but the machine code differs, so results may differ from
# those under XLA's defaults in their last bits: what the tests compare (a resumed run against an
# uninterrupted one, stacked against alone, one process against two) is compiled alike on both
# sides. The claims that depend on how a program is compiled are also checked under XLA's defaults
# (DEFAULT_XLA): the library's own tests at the floors (CI's first step), every run in
# tests/test_multiprocess.py (the one-process against two-process equivalences and the runs that share
# their programs), and the bfloat16 fit. MASKPRIOR_TEST_XLA_FLAGS overrides it ("" for XLA's defaults throughout).
TEST_XLA = os.environ.get("MASKPRIOR_TEST_XLA_FLAGS", "--xla_backend_optimization_level=0 "
                          "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
DEFAULT_XLA = ""


def xla_flags(devices: int | None = None, flags: str = TEST_XLA) -> str:
  """XLA_FLAGS for a command the tests start: `flags`, with `devices` forced host devices if given."""
  return " ".join(([f"--xla_force_host_platform_device_count={devices}"] if devices else []) + flags.split())


SMALL_MODEL = ["--config.model.depth=1", "--config.model.dim=16", "--config.model.num_heads=2",
               "--config.model.head_dim=8", "--config.model.mlp_dim=32"]
SMALL_BOOLEAN = [*SMALL_MODEL, "--config.eval.full_cube_max_n=10", "--config.eval.num_points=512",
                 "--config.eval.probe_size=32"]

ONE_DEVICE = ["--config.train.parallel=off"]

# The default suite's finished Boolean folder (tests/conftest.py's `shared_run`, built once per pytest
# run): f2 on the whole cube (its degree profiles), 100 steps in calls of 50, on one device.
SHORT_BOOLEAN = ["--config.train.steps=100", "--config.train.steps_per_call=50", "--config.eval.every_steps=50",
                 "--config.eval.num_points=512", "--config.eval.probe_size=32", "--config.qk.fit_steps=20",
                 *SMALL_MODEL, *ONE_DEVICE]
F2_FOUR_METHODS = ["boolean", "--task", "f2", "--methods", "vanilla,mimetic,qk,mask", "--seeds", "2", *SHORT_BOOLEAN]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]
