"""The benchmarks that test mask priors, beside the library: Boolean extrapolation,
low-data arithmetic, vision and language, the `maskprior` command line, config files,
run folders and reports. Needs the `bench` extra (`pip install 'maskprior-jax[bench]'`);
the library itself (`maskprior_jax`) never imports this package.
"""
