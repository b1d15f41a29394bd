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
tests start."""
import socket

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
