"""Config files of the arithmetic benchmark (`get_config()`); `default` is the CPU default."""
