"""The vision benchmark from a checkout: same as `maskprior vision` (see maskprior_jax/bench/vision/configs/default.py).

  python experiments/vision.py --workdir runs/vision          # the small CPU default
"""
import sys

from maskprior_jax.bench import cli

if __name__ == "__main__":
  sys.exit(cli.main(["vision", *sys.argv[1:]]))
