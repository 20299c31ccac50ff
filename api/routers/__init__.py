"""The REST service's routes, one router per resource: graphs, plans, sweeps, methods, health
(/healthz, /readyz, /metrics) and the page. `planner.api.app.create_app` includes them;
what they share comes from `planner.api.deps`. A new resource is a new module here plus its
include in create_app (and its test)."""
