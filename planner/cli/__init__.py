"""planner-cli: command modules register themselves on one Typer app (see main.py)."""
