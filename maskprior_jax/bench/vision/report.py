"""The vision benchmark's tables and plots: those of `bench.supervised_report`, which vision shares
with language."""
from maskprior_jax.bench.supervised_report import headline_key, table, write_report

__all__ = ["headline_key", "table", "write_report"]
