"""Config files of the vision benchmark (`get_config()`); `default` is the CPU default."""
