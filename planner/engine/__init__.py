"""The engine: solve / sweep / min-budget, the method registry and plan reports.

One place for the CLI and the service, above the solvers and the contracts (see the layer
contract in pyproject.toml). Import the submodules: this package imports nothing at load time.
"""
