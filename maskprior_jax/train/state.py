"""What one training run is: its state pytree (`TrainState`), how it starts (`create_state`), and
how runs stack into one state with a leading run axis (`stack_trees`)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = ["TrainState", "NonFiniteLoss", "create_state", "stack_trees", "num_params", "LossFn", "UPDATED_COLLECTIONS"]

LossFn = Callable[[dict, Any, jax.Array], tuple[jax.Array, dict]]
#: The key of a loss function's metrics that carries updated model state (e.g. "batch_stats").
UPDATED_COLLECTIONS = "updated_collections"


class NonFiniteLoss(RuntimeError):
  """Raised when a run's loss became NaN or infinite; the last good state was kept."""


@flax.struct.dataclass
class TrainState:
  """One run's training state (or stacked runs', with a leading run axis on every leaf).

  Attributes:
    step: int32 scalar, the number of optimizer steps taken.
    variables: the trainable collections ({"params": ..., "mask_prior": ..., ...}).
    opt_state: the optimizer's state for `variables`.
    rng: raw uint32 key data (plain arrays checkpoint everywhere).
    nonfinite_at: -1, or the step whose loss was not finite. From then on the step leaves the
      state as it was, so the last good state is kept on the device and the host learns of it at
      its next sync point, without waiting on every step.
  """
  step: jax.Array
  variables: dict
  opt_state: Any
  rng: jax.Array
  nonfinite_at: jax.Array


def create_state(variables: dict, tx: optax.GradientTransformation, rng: jax.Array) -> TrainState:
  """A run's initial `TrainState`.

  Args:
    variables: the model's variables (every collection except "intermediates" is kept).
    tx: the optimizer; its state is `tx.init(variables)`.
    rng: the run's key (a typed key or raw key data); stored as key data.

  Returns:
    The state at step 0, with no non-finite loss seen.
  """
  variables = {k: v for k, v in variables.items() if k != "intermediates"}
  return TrainState(step=jnp.zeros((), jnp.int32), variables=variables,
                    opt_state=tx.init(variables), rng=_key_data(rng), nonfinite_at=jnp.full((), -1, jnp.int32))


def _key_data(rng):
  return jax.random.key_data(rng) if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng


def num_params(variables: dict) -> int:
  """Number of elements over the leaves of a variable tree (one run's)."""
  return int(sum(np.prod(np.shape(a), dtype=np.int64) for a in jax.tree.leaves(variables)))


def stack_trees(trees: Sequence[Any]) -> Any:
  """Stacks pytrees of one structure along a new leading (run) axis.

  Args:
    trees: pytrees with the same structure and leaf shapes (e.g. one variable tree per seed).

  Returns:
    One pytree whose leaves have a leading axis of ``len(trees)``.

  Example:
    >>> import jax.numpy as jnp
    >>> from maskprior_jax.train import stack_trees
    >>> stack_trees([{"w": jnp.zeros(3)}, {"w": jnp.ones(3)}])["w"].shape
    (2, 3)
  """
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)
