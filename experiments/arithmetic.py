"""The arithmetic benchmark from a checkout: same as `maskprior arithmetic` (see maskprior_jax/configs/arithmetic.py).

  python experiments/arithmetic.py --workdir runs/arithmetic          # the small CPU default
"""
import sys

from maskprior_jax import cli

if __name__ == "__main__":
  sys.exit(cli.main(["arithmetic", *sys.argv[1:]]))
