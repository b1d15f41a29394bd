"""Command-line pieces shared by the tests that run whole `maskprior boolean` commands in
subprocesses (resume, faults, several processes): what they check (bit-identical resume, layouts,
crash recovery) does not depend on the model's size, so they train a small model and evaluate on a
sample of the cube, which halves each command's compile and run time."""

SMALL_BOOLEAN = ["--config.model.depth=1", "--config.model.dim=16", "--config.model.num_heads=2",
                 "--config.model.head_dim=8", "--config.model.mlp_dim=32", "--config.eval.full_cube_max_n=10",
                 "--config.eval.num_points=512", "--config.eval.probe_size=32"]
