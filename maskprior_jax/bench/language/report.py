"""The language benchmark's tables and plots: those of `bench.supervised_report`, which language shares
with vision."""
from maskprior_jax.bench.supervised_report import headline_key, table, write_report

__all__ = ["headline_key", "table", "write_report"]
