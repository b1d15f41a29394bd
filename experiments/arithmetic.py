"""The arithmetic benchmark from a checkout: same as `maskprior arithmetic` (see maskprior_jax/bench/arithmetic/configs/default.py).

  python experiments/arithmetic.py --workdir runs/arithmetic          # the small CPU default
"""
import sys

from maskprior_jax.bench import cli

if __name__ == "__main__":
  sys.exit(cli.main(["arithmetic", *sys.argv[1:]]))
