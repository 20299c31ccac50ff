#!/bin/sh
# Slim the service's virtual environment for the image (the Dockerfile's build stage runs it on
# /opt/venv once everything is installed): what the service never loads at run time goes.
#   docker/slim_venv.sh /opt/venv [docker/import_service.py]
# - the installers (pip, setuptools, wheel): the image installs nothing at run time;
# - test suites shipped inside packages (pandas/tests alone is 46 MB);
# - pulp's CBC binaries for other systems and processors (pulp runs the one for this machine);
# - byte code: every __pycache__ is removed, then the script given (docker/import_service.py:
#   the service's modules, with what they import) runs once, so only what the service loads is
#   compiled (the image's user cannot write to the environment: without byte code each start
#   would compile all it imports again).
# Measured on the service's requirements (python 3.11, x86_64): 529 MB before, see the
# Dockerfile for the size after.
set -eu
venv=${1:?usage: slim_venv.sh VENV [IMPORT_SCRIPT]}
imports=${2:-}
python="$venv/bin/python"
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

"$python" -m pip uninstall --yes --quiet pip setuptools wheel 2>/dev/null || true
rm -f "$venv"/bin/pip "$venv"/bin/pip3* "$venv"/bin/wheel

# Folders named tests inside packages (never a package's own runtime modules: numpy.testing,
# pandas._testing and sqlalchemy.testing are named otherwise and stay).
find "$site" -mindepth 2 -depth -type d -name tests -exec rm -rf {} +

cbc="$site/pulp/solverdir/cbc"
if [ -d "$cbc" ]; then
    case "$(uname -s)-$(uname -m)" in
        Linux-x86_64) keep=linux/i64 ;;
        Linux-aarch64 | Linux-arm64) keep=linux/arm64 ;;
        Linux-i?86) keep=linux/i32 ;;
        *) keep= ;;
    esac
    if [ -n "$keep" ] && [ -d "$cbc/$keep" ]; then
        for dir in "$cbc"/*/*; do
            case "$dir" in "$cbc/$keep") ;; *) rm -rf "$dir" ;; esac
        done
        find "$cbc" -mindepth 1 -maxdepth 1 -type d -empty -delete
    fi
fi

find "$site" -depth -type d -name __pycache__ -exec rm -rf {} +
if [ -n "$imports" ]; then
    env -u PYTHONDONTWRITEBYTECODE "$python" "$imports"
fi
