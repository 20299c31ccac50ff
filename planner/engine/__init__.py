"""The engine: one request resolution, solve / sweep / min-budget / partition, the method
registry (derived from the specs the methods declare) and plan reports.

One place for the CLI and the service, above the solvers and the contracts (see the layer
contract in pyproject.toml). Import the submodules: this package imports nothing at load time.
"""
