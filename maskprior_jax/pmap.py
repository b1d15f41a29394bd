"""The `jax.pmap` form of the training step, for code written against pmap: the state replicated
per device, the batch split on its leading device axis, gradients averaged with `lax.pmean`.
Tested to equal the single-device step of `maskprior_jax.train`; new code (and the benchmarks)
use `train.make_train_step` with a mesh instead."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from maskprior_jax.train.state import LossFn
from maskprior_jax.train.steps import step_fn


def make_pmap_train_step(loss_fn: LossFn, tx: optax.GradientTransformation, axis_name: str = "batch"):
  """The same step as `train.make_train_step` under `jax.pmap` (state replicated per device, batch split on
  its leading device axis, gradients averaged with `lax.pmean`). Tested to equal the
  single-device step; the benchmarks use `make_train_step` with a mesh instead."""
  reduce = lambda tree: jax.lax.pmean(tree, axis_name)
  return jax.pmap(step_fn(loss_fn, tx, reduce), axis_name=axis_name, donate_argnums=(0,))


def replicate_for_pmap(tree):
  """One copy of `tree` per local device, stacked on a leading axis (pmap's layout)."""
  n = jax.local_device_count()
  return jax.tree.map(lambda x: jnp.stack([x] * n), tree)


