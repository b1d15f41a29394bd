"""Command-line pieces shared by the tests that run whole `maskprior boolean` commands (resume,
faults, several processes, the CLI's own behaviour): what they check (bit-identical resume, layouts,
crash recovery, files and messages) does not depend on the model's size, so they train a small model
(SMALL_MODEL) and, where no test reads the whole cube's degree profile, evaluate on a sample of the
cube (SMALL_BOOLEAN), which halves each command's compile and run time. `free_port()`: a port on
127.0.0.1 that nothing listens on, for a coordinator or an emulator the tests start."""
import socket

SMALL_MODEL = ["--config.model.depth=1", "--config.model.dim=16", "--config.model.num_heads=2",
               "--config.model.head_dim=8", "--config.model.mlp_dim=32"]
SMALL_BOOLEAN = [*SMALL_MODEL, "--config.eval.full_cube_max_n=10", "--config.eval.num_points=512",
                 "--config.eval.probe_size=32"]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]
