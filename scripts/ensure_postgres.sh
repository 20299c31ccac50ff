#!/usr/bin/env bash
# A PostgreSQL server for the service tests. Prints its URL (last line of stdout), e.g.
#   postgresql+psycopg://planner@127.0.0.1:54329/planner
# Installs PostgreSQL with apt-get when it is missing, runs the server as a non-root user from a
# data directory under /tmp, listening on 127.0.0.1 only (trust authentication: a throw-away test
# server), and creates the role and database. Idempotent: a running server is reused.
# When it cannot do this it says why on stderr, prints no URL and exits 0 (the tests then skip).
#   scripts/ensure_postgres.sh          start (or reuse) and print the URL
#   scripts/ensure_postgres.sh --stop   stop the server
#   scripts/ensure_postgres.sh --status exit 0 when a server runs from the data directory (it
#                                       installs and starts nothing): scripts/test stops at exit
#                                       only a server that was not running before it
# Environment: PLANNER_PG_PORT (54329), PLANNER_PG_DIR (/tmp/planner-postgres-<port>).
set -uo pipefail

PORT=${PLANNER_PG_PORT:-54329}
DIR=${PLANNER_PG_DIR:-${TMPDIR:-/tmp}/planner-postgres-$PORT}
ROLE=planner
DB=planner
URL="postgresql+psycopg://$ROLE@127.0.0.1:$PORT/$DB"

say() { echo "ensure_postgres: $*" >&2; }

if [ "${1:-}" = "--status" ]; then  # the postmaster's pid file names a live process
  pid=$(head -n 1 "$DIR/data/postmaster.pid" 2>/dev/null) || exit 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
  exit $?
fi
give_up() {
  say "$*; PostgreSQL tests will be skipped"
  exit 0
}

find_bindir() {
  local d
  if command -v pg_ctl >/dev/null 2>&1; then
    d=$(dirname "$(readlink -f "$(command -v pg_ctl)")")
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  fi
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$d" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  return 1
}

install_postgres() {
  command -v apt-get >/dev/null 2>&1 || give_up "PostgreSQL is not installed and there is no apt-get"
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null \
      || give_up "PostgreSQL is not installed and apt-get needs root"
    sudo=(sudo -n)
  fi
  say "installing PostgreSQL with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! "${sudo[@]}" apt-get install -y -q postgresql >&2; then
    "${sudo[@]}" apt-get update -q >&2 || true
    "${sudo[@]}" apt-get install -y -q postgresql >&2 || give_up "apt-get could not install postgresql"
  fi
}

BINDIR=$(find_bindir) || { install_postgres; BINDIR=$(find_bindir) || give_up "no pg_ctl after installing"; }

# The server refuses to run as root: use the postgres account (or a dedicated one).
as_user() { "$@"; }
if [ "$(id -u)" = 0 ]; then
  RUN_USER=postgres
  if ! id "$RUN_USER" >/dev/null 2>&1; then
    RUN_USER=planner-pg
    id "$RUN_USER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin \
      "$RUN_USER" >&2 || give_up "cannot create a non-root user for the server"
  fi
  if command -v runuser >/dev/null 2>&1; then
    as_user() { runuser -u "$RUN_USER" -- "$@"; }
  elif command -v setpriv >/dev/null 2>&1; then
    as_user() { setpriv --reuid="$RUN_USER" --regid="$(id -g "$RUN_USER")" --init-groups -- "$@"; }
  else
    give_up "running as root without runuser or setpriv to drop privileges"
  fi
  mkdir -p "$DIR" && chown "$RUN_USER" "$DIR" && chmod 700 "$DIR" || give_up "cannot prepare $DIR"
else
  mkdir -p "$DIR" && chmod 700 "$DIR" || give_up "cannot prepare $DIR"
fi
DATA="$DIR/data"

if [ "${1:-}" = "--stop" ]; then
  as_user "$BINDIR/pg_ctl" -D "$DATA" -m fast stop >&2 || true
  exit 0
fi

if ! as_user "$BINDIR/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  if [ ! -f "$DATA/PG_VERSION" ]; then
    as_user "$BINDIR/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 >"$DIR/initdb.log" 2>&1 \
      || give_up "initdb failed (see $DIR/initdb.log)"
  fi
  as_user "$BINDIR/pg_ctl" -D "$DATA" -l "$DIR/server.log" -w -t 60 \
    -o "-h 127.0.0.1 -p $PORT -k $DIR" start >/dev/null 2>&1 \
    || give_up "the server did not start (see $DIR/server.log)"
fi

psql_admin() {
  "$BINDIR/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA "$@"
}
if [ "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'")" != 1 ]; then
  psql_admin -c "CREATE ROLE $ROLE LOGIN CREATEDB" >&2 || give_up "cannot create role $ROLE"
fi
if [ "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != 1 ]; then
  psql_admin -c "CREATE DATABASE $DB OWNER $ROLE" >&2 || give_up "cannot create database $DB"
fi
echo "$URL"
