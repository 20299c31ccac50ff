"""Importers from other projects' graph formats onto graph.json."""
