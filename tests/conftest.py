import os
import tempfile

# Several host devices, so multi-device code is exercised on CPU. Must be set before JAX starts.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One XLA compilation cache for the whole session: this process, pytest-xdist's workers (started
# after this file is read, so they inherit it) and the command-line runs tests start. The
# end-to-end tests compile the same programs (the same models, steps and evaluations) many times;
# a cached executable is the same compiled program, so nothing a test compares changes.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="maskprior-tests-xla-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
