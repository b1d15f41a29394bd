"""maskprior-jax: learnable attention mask priors for JAX/Flax."""
from maskprior_jax.attention import ATTENTION_WEIGHTS, MASK_PRIOR, MaskPriorAttention
from maskprior_jax import priors
from maskprior_jax.optim import mask_prior_optimizer, with_mask_transform

__version__ = "0.1.0"

__all__ = ["MASK_PRIOR", "ATTENTION_WEIGHTS", "MaskPriorAttention", "priors",
           "mask_prior_optimizer", "with_mask_transform", "__version__"]
