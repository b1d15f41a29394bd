"""maskprior-jax: learnable attention mask priors for JAX/Flax.

The mask's path through the library, one module each:

- `maskprior_jax.priors`: structure -> initializer (which positions interact, never target values).
- `maskprior_jax.attention`: `MaskPriorAttention` keeps the bias in its own collection, "mask_prior".
- `maskprior_jax.optim`: `mask_prior_optimizer` gives that collection its own rule (or freezes it).
- `maskprior_jax.train`: the compiled step, the placements and the training loop.

The benchmarks live beside the library in ``maskprior_jax.bench`` (extra "bench").
"""
from maskprior_jax import priors
from maskprior_jax.attention import (ATTENTION_WEIGHTS, MASK_PRIOR, MaskPriorAttention, MaskSettings,
                                     dot_product_attention)
from maskprior_jax.optim import mask_prior_optimizer, with_mask_transform

from maskprior_jax.version import __version__

__all__ = ["MASK_PRIOR", "ATTENTION_WEIGHTS", "MaskPriorAttention", "MaskSettings", "priors",
           "mask_prior_optimizer", "with_mask_transform", "dot_product_attention", "__version__"]
