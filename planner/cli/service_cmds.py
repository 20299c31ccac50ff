"""Service commands: `serve` (the planning service) and its clients `submit` and `status`.

The clients speak HTTP (httpx) and never import the service; `serve` imports `api` only when run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from planner.cli.options import (
    BUDGET_HELP,
    METHOD_HELP,
    OptionalTimeLimitOpt,
    OptionsOpt,
    ResourcesOpt,
    method_options,
    resources_input,
)
from planner.cli.output import (
    bytes_text,
    console,
    key_value_table,
    percent_text,
    print_json,
    seconds_text,
)
from planner.core.errors import InputError, NoPlanFits

if TYPE_CHECKING:
    from planner.api.client import PlannerClient
    from planner.api.store import Store

DEFAULT_SERVER = "http://127.0.0.1:8000"
ServerOpt = Annotated[
    str,
    typer.Option("--server", "-s", envvar="PLANNER_SERVER", help="Service URL."),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar="PLANNER_API_KEY", help="Bearer API key (if the server asks)."),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
OutputOpt = Annotated[Path | None, typer.Option("-o", "--output", help="plan.json to write")]


DatabaseUrlOpt = Annotated[
    str | None,
    typer.Option("--database-url", help="The service's SQLAlchemy URL (PLANNER_DATABASE_URL)."),
]
keys_app = typer.Typer(
    help="The service's API keys, each a tenant's, in its database: a change holds for the "
    "running service within PLANNER_API_KEY_CACHE_S (5 s), no restart.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("submit")(submit)
    app.command("status")(status)
    keys_app.command("add")(keys_add)
    keys_app.command("list")(keys_list)
    keys_app.command("revoke")(keys_revoke)
    app.add_typer(keys_app, name="keys")


def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (PLANNER_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (PLANNER_PORT).")] = None,
    database_url: Annotated[
        str | None, typer.Option("--database-url", help="SQLAlchemy URL (PLANNER_DATABASE_URL).")
    ] = None,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Solves at once (PLANNER_WORKERS).")
    ] = None,
) -> None:
    """Run the planning service (REST API; jobs in worker processes; SQLite file by default).

    Exit 4: the port is in use (nothing else is touched); exit 5: the service could not start."""
    from pydantic import ValidationError

    from planner.api.server import serve as run_service
    from planner.api.settings import load_settings
    from planner.core.errors import describe_validation_error

    overrides: dict[str, Any] = {
        k: v
        for k, v in dict(host=host, port=port, database_url=database_url, workers=workers).items()
        if v is not None
    }
    try:
        settings = load_settings(**overrides)
    except ValidationError as e:
        raise InputError(f"settings: {describe_validation_error(e)}") from None
    def banner(auth_on: bool) -> None:
        # Whether authentication is on as the server decided it (keys in the database count).
        console.print(
            f"planner service on http://{settings.host}:{settings.port} (page /, API docs "
            f"/docs; database {_redact(settings.database_url)}, {settings.workers} workers, "
            f"auth {'on' if auth_on else 'off'})"
        )

    # Printed once the port is ours and the database usable: a failed start shows only its error.
    code = run_service(settings, on_ready=banner)
    if code:
        raise typer.Exit(code)


def _redact(url: str) -> str:
    """The database URL without its password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url


def _client(server: str, token: str | None) -> PlannerClient:
    from planner.api.client import PlannerClient

    return PlannerClient(server, token)


def _call(
    client: PlannerClient, method: str, path: str, **kwargs: Any
) -> tuple[int, dict[str, Any]]:
    from planner.api.client import ServiceError

    try:
        return client.request(method, path, **kwargs)
    except ServiceError as e:
        raise InputError(str(e)) from None


def submit(
    graph_path: Annotated[Path, typer.Argument(metavar="GRAPH", help="graph.json to plan")],
    budget: Annotated[str, typer.Option("--budget", "-b", help=BUDGET_HELP)],
    server: ServerOpt = DEFAULT_SERVER,
    method: Annotated[str, typer.Option("--method", "-m", help=METHOD_HELP)] = "auto",
    option: OptionsOpt = None,
    resources: ResourcesOpt = None,
    time_limit: OptionalTimeLimitOpt = None,
    wait: Annotated[bool, typer.Option("--wait", help="Poll until the plan is finished.")] = False,
    output: OutputOpt = None,
    token: TokenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Send a graph and a budget to the service; with --wait, poll and print the plan summary.

    --option KEY=VALUE as for `solve`: typed from the method's spec here (the service checks
    them again), a method only the service knows (a plugin) takes JSON values. --resources: a
    preset's name is sent as it is, a resources.json file as its document."""
    from planner.core.io import read_json

    options = method_options(option, method)  # a typo is one line before anything is sent
    document = read_json(graph_path)
    body: dict[str, Any] = {"graph": document, "budget": _budget_value(budget), "method": method}
    if options:
        body["options"] = options
    machine = resources_input(resources)
    if machine is not None:  # the service resolves it, as solve does here
        body["resources"] = read_json(machine) if isinstance(machine, Path) else machine
    if time_limit is not None:
        body["time_limit"] = time_limit
    with _client(server, token) as client:
        code, answer = _call(client, "POST", "/v1/plans", json=body)
        if code == 202 and wait:
            answer = _poll(client, answer["id"], as_json, base_cost=graph_compute_ms(document),
                           time_limit_s=time_limit)
        elif code == 202:
            if as_json:
                print_json(answer)
            else:
                console.print(f"queued: {answer['id']}  (planner-cli status {answer['id']})")
            return
    _show(answer, as_json, output)


def status(
    plan_id: Annotated[str, typer.Argument(metavar="ID", help="Plan job id from submit")],
    server: ServerOpt = DEFAULT_SERVER,
    wait: Annotated[bool, typer.Option("--wait", help="Poll until the plan is finished.")] = False,
    output: OutputOpt = None,
    token: TokenOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Show a plan job: status, progress, and the plan summary when finished."""
    with _client(server, token) as client:
        if wait:
            answer = _poll(client, plan_id, as_json)
        else:
            _, answer = _call(client, "GET", f"/v1/plans/{plan_id}")
    _show(answer, as_json, output)


def _budget_value(text: str) -> str:
    """The budget as written, checked here first (the service reads the same grammar), so a
    typo is one line before anything is sent."""
    from planner.core.budget import parse_budget_spec

    parse_budget_spec(text, "budget")
    return text.strip()


def _poll(client: PlannerClient, plan_id: str, quiet: bool, *, base_cost: float | None = None,
          time_limit_s: float | None = None) -> dict[str, Any]:
    """Wait for the job, its status and progress on stderr as they change (progress_view)."""
    from planner.api.client import ServiceError
    from planner.cli.progress_view import work_status

    with work_status(f"plan {plan_id}", quiet=quiet, limit_s=time_limit_s,
                     detail="submitted") as line:

        def show(job: dict[str, Any]) -> None:
            progress = progress_text(job.get("progress"), base_cost)
            line.update(str(job.get("status")) + (f" · {progress}" if progress else ""))

        try:
            return client.wait(plan_id, on_change=show)
        except ServiceError as e:
            raise InputError(str(e)) from None


def progress_text(progress: dict[str, Any] | None, base_cost: float | None) -> str:
    """A job's progress for people: overheads when the graph's cost is known (submit), else
    the best plan's and the bound's compute cost in ms; '' before there is any."""
    progress = progress or {}
    best, bound = progress.get("best_objective"), progress.get("best_bound")
    if best is None and bound is None:
        return ""
    if base_cost:
        from planner.cli.progress_view import describe

        return describe(best, bound, base_cost)
    shown = ["-" if v is None else f"{float(v):.6g} ms" for v in (best, bound)]
    return f"best {shown[0]} · bound {shown[1]}"


def graph_compute_ms(document: Any) -> float | None:
    """The total compute cost of a graph.json document (its nodes' compute_ms): the base the
    job's progress is an overhead over."""
    nodes = document.get("nodes") if isinstance(document, dict) else None
    if not isinstance(nodes, list):
        return None
    costs = [n.get("compute_ms") for n in nodes if isinstance(n, dict)]
    numbers = [float(c) for c in costs if isinstance(c, (int, float))]
    return sum(numbers) if numbers and len(numbers) == len(nodes) else None


def job_rows(answer: dict[str, Any], written: Path | None) -> list[tuple[str, Any]]:
    """The rows of a job's table in human units: bytes as 'MiB (exact B)', overhead and gap
    as percentages, seconds (--json keeps the service's raw document)."""
    report = answer.get("report") or {}
    rows: list[tuple[str, Any]] = [
        ("id", answer["id"]),
        ("status", answer["status"] + (" (from the store)" if answer.get("cached") else "")),
        ("method", answer["method"] + (f" / {report['backend']}" if report.get("backend")
                                        else "")),
        ("budget", bytes_text(answer.get("budget_bytes"))),
    ]
    if progress := progress_text(answer.get("progress"), None):
        rows.append(("progress", progress))
    shown: dict[str, tuple[str, Callable[[Any], str]]] = {
        "peak_bytes": ("peak", bytes_text),
        "overhead_percent": ("compute overhead", percent_text),
        "gap_percent": ("gap to bound", lambda v: percent_text(v, signed=False)),
        "smallest_feasible_bytes": ("smallest budget found to work", bytes_text),
        "wall_seconds": ("time", seconds_text),
    }
    for key, (label, fmt) in shown.items():
        if report.get(key) is not None:
            rows.append((label, fmt(report[key])))
    if answer.get("error"):
        rows.append(("reason", answer["error"]))
    if written is not None:
        rows.append(("plan written to", str(written)))
    return rows


def _show(answer: dict[str, Any], as_json: bool, output: Path | None) -> None:
    plan = answer.get("plan")
    written = None
    if output is not None and plan is not None and answer["status"] == "done":
        from planner.core.io import write_json

        write_json(output, plan)
        written = output
    if as_json:
        print_json(answer)
    else:
        console.print(key_value_table("plan", job_rows(answer, written)))
    if answer["status"] == "infeasible":
        smallest = (answer.get("report") or {}).get("smallest_feasible_bytes")
        known = "" if smallest is None else (
            f"; smallest feasible found: {smallest} bytes (the report's smallest_feasible_bytes)"
        )
        raise NoPlanFits(
            f"plan {answer['id']}: no plan within {answer['budget_bytes']} bytes{known}",
            smallest,
        )
    if answer["status"] in ("failed", "cancelled"):
        print(f"plan {answer['id']} {answer['status']}: {answer.get('error')}", file=sys.stderr)
        raise typer.Exit(1)


# -- keys ---------------------------------------------------------------------------------------
def _key_store(database_url: str | None) -> Store:
    """The service's store (its schema made or brought up to date), from --database-url or the
    service's settings. An unusable database: one line, exit 5 (as `serve`)."""
    from sqlalchemy.exc import SQLAlchemyError

    from planner.api.settings import load_settings
    from planner.api.store import Store

    url = database_url or load_settings().database_url
    try:
        store = Store(url)
        store.create_schema()
    except SQLAlchemyError as e:
        cause = getattr(e, "orig", None) or e
        print(f"error: database {_redact(url)}: {cause}", file=sys.stderr)
        raise typer.Exit(5) from None
    return store


def keys_add(
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant the key acts for.")],
    admin: Annotated[bool, typer.Option("--admin", help="The key sees every tenant's jobs, "
                                        "graphs and sweeps.")] = False,
    database_url: DatabaseUrlOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Make a key for a tenant and print it once (only its sha256 is stored)."""
    from planner.api.auth_state import remember_auth

    store = _key_store(database_url)
    try:
        key, secret = store.add_key(tenant, admin=admin)
    finally:
        store.dispose()
    # From now on a service on this database without keys (a lost one) refuses to start.
    remember_auth(store.url, os.environ.get("PLANNER_STATE_DIR"))
    if as_json:
        print_json({"id": key.id, "tenant": key.tenant, "admin": key.admin, "key": secret})
        return
    role = "admin key" if key.admin else "key"
    print(f"{role} {key.id} for tenant {key.tenant}; the key, shown this once:", file=sys.stderr)
    print(secret)


def keys_list(database_url: DatabaseUrlOpt = None, as_json: JsonFlag = False) -> None:
    """Every key: id, tenant, prefix, created, admin, revoked (never the key itself)."""
    from rich.table import Table

    from planner.api.job_views import iso

    store = _key_store(database_url)
    try:
        keys = store.list_keys()
    finally:
        store.dispose()
    rows = [{"id": k.id, "tenant": k.tenant, "prefix": k.prefix, "created": iso(k.created_at),
             "admin": k.admin, "revoked": iso(k.revoked_at)} for k in keys]
    if as_json:
        print_json({"keys": rows})
        return
    table = Table("id", "tenant", "prefix", "created", "admin", "revoked")
    for k in keys:
        table.add_row(k.id, k.tenant, f"{k.prefix}...", iso(k.created_at),
                      "yes" if k.admin else "", iso(k.revoked_at) or "")
    console.print(table if rows else "no keys (authentication is off unless PLANNER_API_KEYS "
                  "holds some)")


def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (planner-cli keys list).")],
    database_url: DatabaseUrlOpt = None,
) -> None:
    """Revoke a key: the service answers it 401 from now on (within the key cache's time)."""
    store = _key_store(database_url)
    try:
        key = store.revoke_key(key_id)
    finally:
        store.dispose()
    if key is None:
        raise InputError(f"key id {key_id!r}: no such key; see planner-cli keys list")
    console.print(f"revoked key {key.id} ({key.prefix}...) of tenant {key.tenant}")
