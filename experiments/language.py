"""The language benchmark from a checkout: same as `maskprior language` (see maskprior_jax/bench/language/configs/default.py).

  python experiments/language.py --workdir runs/language          # the small CPU default
"""
import sys

from maskprior_jax.bench import cli

if __name__ == "__main__":
  sys.exit(cli.main(["language", *sys.argv[1:]]))
