"""The Boolean extrapolation benchmark from a checkout: same as `maskprior boolean`.

  python experiments/boolean.py --workdir runs/boolean                 # headline, CPU default
  python experiments/boolean.py --task f2 --seeds 3 --config.train.steps=3000
  python experiments/boolean.py --config experiments/boolean_paper.py  # GOTU's scale (GPU/TPU)
"""
import sys

from maskprior_jax.bench import cli

if __name__ == "__main__":
  sys.exit(cli.main(["boolean", *sys.argv[1:]]))
