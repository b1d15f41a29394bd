"""The language benchmark: a byte-level causal LM (or text classifier) with a 1-D recency prior."""
