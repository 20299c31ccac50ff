# syntax=docker/dockerfile:1
# The planning service image: slim and torch-free (only the `postgres` extra is installed, never
# `torch`), running as a non-root user, with a health check on /readyz. The environment is
# slimmed before it is copied into the final stage (docker/slim_venv.sh: no pip or setuptools,
# no packages' test suites, pulp's solver binary for this machine only, byte code only for what
# the service imports): 529 MB of requirements became 371 MB (python 3.11, x86_64). Built with
# scripts/build_image.sh (bookworm base: 175 MB of it) the image is 550 MB (702 MB before).
#   docker build -t planner-service .
#   docker run -p 127.0.0.1:8000:8000 -v planner-data:/data planner-service
# Embedded SQLite store in the /data volume by default; set PLANNER_DATABASE_URL for PostgreSQL
# (docker/compose.yml runs both).
# BASE is any Debian-like image with python3 (>= 3.11), its venv module and useradd: the default
# from Docker Hub, or a local bookworm base where Docker Hub is out of reach
# (scripts/build_image.sh makes one with debootstrap and builds with buildah).

ARG BASE=python:3.12-slim

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml ./
# The dependencies first, in a layer of their own (the project without its code or README
# installs only them): a change of the code or the README alone reuses it.
RUN touch README.md \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --upgrade pip setuptools wheel \
    && /opt/venv/bin/pip install ".[postgres]" \
    && /opt/venv/bin/pip uninstall --yes planner
COPY README.md ./
COPY planner ./planner
COPY solvers ./solvers
COPY api ./api
COPY docker/slim_venv.sh docker/import_service.py ./docker/
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation . \
    && ! /opt/venv/bin/python -c "import torch" 2>/dev/null \
    && sh docker/slim_venv.sh /opt/venv docker/import_service.py \
    && ! /opt/venv/bin/python -c "import pip" 2>/dev/null

FROM ${BASE}
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/planner planner \
    && mkdir -p /data \
    && chown planner:planner /data
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MPLBACKEND=Agg \
    MPLCONFIGDIR=/tmp/matplotlib \
    PLANNER_HOST=0.0.0.0 \
    PLANNER_PORT=8000 \
    PLANNER_DATABASE_URL=sqlite:////data/planner-service.db
USER planner
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('PLANNER_PORT', '8000'), timeout=4)"]
STOPSIGNAL SIGINT
CMD ["planner-cli", "serve"]
