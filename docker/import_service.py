"""Import what the service loads (docker/slim_venv.sh runs it once, so that only these modules
are byte-compiled in the image): every module of the planner package but the torch-only layers
(tracing, zoo, runtime), and what they load only when used: the server, its protocols and
loop, the PostgreSQL driver, the solver back ends, the chart renderer."""

import importlib
import os
import pkgutil

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("MPLCONFIGDIR", "/tmp/matplotlib")

import planner  # noqa: E402

SKIP = ("planner.tracing", "planner.zoo", "planner.runtime")
EXTRA = [
    "uvicorn.main", "uvicorn.protocols.http.h11_impl", "uvicorn.lifespan.on",
    "uvicorn.loops.uvloop", "uvicorn.loops.asyncio", "psycopg", "psycopg_binary",
    "sqlalchemy.dialects.postgresql.psycopg", "sqlalchemy.dialects.sqlite.pysqlite",
    "matplotlib.pyplot", "matplotlib.backends.backend_agg", "matplotlib.backends.backend_svg",
    "ortools.sat.python.cp_model", "pulp", "multiprocessing.forkserver",
    "concurrent.futures.process",
]

for info in pkgutil.walk_packages(planner.__path__, "planner."):
    if info.name.startswith(SKIP) or info.name.endswith("__main__"):
        continue
    importlib.import_module(info.name)
for name in EXTRA:
    importlib.import_module(name)
