"""Config files of the language benchmark (`get_config()`); `default` is the CPU default."""
