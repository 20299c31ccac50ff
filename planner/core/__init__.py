"""The contracts: graph.json, plan.json, resources, model state, the budget grammar, errors, io,
importers. Imports nothing else of the project."""
