"""Compiled training: a train-state pytree, a jitted (optionally run-vmapped, multi-step) train step
that is data parallel over a device mesh (or FSDP-sharded), an eval step, and `train_seeds`, the one
training loop every benchmark runs (stacked runs, periodic evaluation, checkpoints and SIGTERM
handling), driven by one `LoopSettings`. The `pmap` form of the same step lives in
`maskprior_jax.pmap`; meshes and shardings in `maskprior_jax.sharding`.

A loss function has the signature `loss_fn(variables, batch, rng) -> (loss, metrics)`, where
`variables` is the model's variable tree {"params": ..., "mask_prior": ..., ...}. A model with
state of its own (e.g. "batch_stats") returns the new collections in
`metrics[UPDATED_COLLECTIONS]`; they replace the old ones after the optimizer step (the optimizer
of `maskprior_jax.optim` never changes them itself).

The modules, by question:

  state       what a run is: `TrainState`, `create_state`, `stack_trees`
  settings    what the loop reads: `LoopSettings`
  placement   where the runs go: `Placement`, chosen once by `placement.choose`
  batches     where batches come from: a host batch function or `DeviceBatches`
  steps       the compiled step: `make_train_step`, `make_generating_train_step`, `loop_step`
  stepping    how a placement steps its runs: one `Stepper` per placement, `RunBlocks`
  loop        the loop itself: `train_seeds`, `Progress`
"""
from maskprior_jax.sharding import batch_sharding, data_mesh, fsdp_sharding, replicated
from maskprior_jax.train.batches import DeviceBatches
from maskprior_jax.train.loop import Progress, train_seeds
from maskprior_jax.train.placement import Placement
from maskprior_jax.train.settings import GRAD_REDUCTIONS, LoopSettings
from maskprior_jax.train.state import UPDATED_COLLECTIONS, NonFiniteLoss, TrainState, create_state, stack_trees
from maskprior_jax.train.stepping import RunBlocks, Stepper, stepper
from maskprior_jax.train.steps import loop_step, make_eval_step, make_generating_train_step, make_train_step
# Reachable as before the split, outside the documented names:
from maskprior_jax.sharding import run_sharding  # noqa: F401,E402
from maskprior_jax.train.batches import HostBatches  # noqa: F401
from maskprior_jax.train.placement import RUNS_MAX_PARAMS  # noqa: F401
from maskprior_jax.train.settings import BATCH_SOURCES, PARALLEL  # noqa: F401
from maskprior_jax.train.state import LossFn, num_params  # noqa: F401
from maskprior_jax.train.steps import step_fn  # noqa: F401

__all__ = ["LoopSettings", "Placement", "DeviceBatches", "TrainState", "NonFiniteLoss", "create_state", "make_train_step",
           "make_generating_train_step", "make_eval_step", "train_seeds", "loop_step", "RunBlocks", "Stepper", "stepper",
           "stack_trees", "Progress", "data_mesh", "batch_sharding", "replicated", "fsdp_sharding", "GRAD_REDUCTIONS",
           "UPDATED_COLLECTIONS"]
