"""Config files of the boolean benchmark (`get_config()`); `default` is the CPU default."""
