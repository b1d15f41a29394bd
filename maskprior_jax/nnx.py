"""NNX interop: the mask-prior collection as its own NNX variable type.

Importing this module registers `MaskPrior` for the "mask_prior" collection, so a Linen
module wrapped with `flax.nnx.bridge.ToNNX` exposes its bias as `MaskPrior`, not `Param`:
`nnx.state(model, MaskPrior)` selects it, and `nnx.Optimizer(..., wrt=nnx.Param)` leaves it out.
"""
from flax import nnx

from maskprior_jax.attention import MASK_PRIOR


class MaskPrior(nnx.Variable):
  """A learnable additive attention-logit bias."""


nnx.register_variable_name(MASK_PRIOR, MaskPrior, overwrite=True)
