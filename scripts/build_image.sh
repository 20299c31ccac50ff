#!/usr/bin/env bash
# Builds the service image (Dockerfile) with buildah, without Docker Hub: the base is a Debian
# bookworm made once with debootstrap (python3, python3-venv) and kept as a local image, and the
# Dockerfile is built on it (`--build-arg BASE=...`, `--isolation chroot`: no daemon, no
# registry). Pip inside the build reaches the package index for the service's dependencies; the
# base trusts the host's CA bundle (PIP_CERT points at it), so a TLS-inspecting proxy that the
# host trusts works inside the build too.
# One line per step on stderr; the image id is the last line of stdout.
#   scripts/build_image.sh               build localhost/planner-service:latest
# Exit codes: 0 built; 1 the build failed (a broken Dockerfile or pip install: its log is named);
# 2 it cannot run here (not root, no apt-get, buildah or debootstrap cannot be installed or run,
# the Debian mirror or the package index out of reach): the tests skip with that line.
# Environment:
#   PLANNER_IMAGE_TAG     the image's name (localhost/planner-service:latest)
#   PLANNER_IMAGE_CACHE   where the base's tar and the logs are kept (~/.cache/planner-image)
#   PLANNER_IMAGE_MIRROR  the Debian mirror for debootstrap (http://deb.debian.org/debian)
set -uo pipefail
cd "$(dirname "$0")/.."

TAG=${PLANNER_IMAGE_TAG:-localhost/planner-service:latest}
CACHE=${PLANNER_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/planner-image}
MIRROR=${PLANNER_IMAGE_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates
HOST_CA=/etc/ssl/certs/ca-certificates.crt
# The names say what is in them: a change of suite or packages makes a new tar, and of those or
# of the host's CA bundle a new base image.
BASE_TAR="$CACHE/$SUITE-$(printf '%s' "$PACKAGES" | sha256sum | cut -c1-12).tar"
BASE_TAG="localhost/planner-base:$SUITE-$(
  { printf '%s\n' "$PACKAGES"; cat "$HOST_CA" 2>/dev/null; } | sha256sum | cut -c1-12)"

say() { echo "build_image: $*" >&2; }
cannot() { say "cannot build here: $*"; exit 2; }
failed() { say "$*"; exit 1; }

[ "$(id -u)" = 0 ] || cannot "debootstrap and buildah's chroot builds need root; run as root"
mkdir -p "$CACHE" || cannot "cannot create the cache folder $CACHE"

install_tools() {
  local missing=()
  command -v buildah >/dev/null 2>&1 || missing+=(buildah)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  [ ${#missing[@]} = 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 || cannot "${missing[*]} missing and there is no apt-get"
  say "installing ${missing[*]} with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q "${missing[@]}" >"$CACHE/apt.log" 2>&1; then
    apt-get update -q >>"$CACHE/apt.log" 2>&1 || true
    apt-get install -y -q "${missing[@]}" >>"$CACHE/apt.log" 2>&1 \
      || cannot "apt-get could not install ${missing[*]} (log: $CACHE/apt.log)"
  fi
}

# The base as a local image: from the store, else from the cached tar, else made anew.
make_base() {
  buildah inspect --type image "$BASE_TAG" >/dev/null 2>&1 && return 0
  if [ ! -s "$BASE_TAR" ]; then
    local root="$CACHE/rootfs.$$"
    say "making the $SUITE base with debootstrap (about a minute; cached in $BASE_TAR)"
    rm -rf "$root"
    if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" \
      >"$CACHE/debootstrap.log" 2>&1; then
      rm -rf "$root"
      cannot "debootstrap failed, mirror $MIRROR (log: $CACHE/debootstrap.log)"
    fi
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" --numeric-owner -cf "$BASE_TAR.part" . && mv "$BASE_TAR.part" "$BASE_TAR" \
      || { rm -rf "$root" "$BASE_TAR.part"; cannot "cannot write $BASE_TAR"; }
    rm -rf "$root"
  fi
  say "importing the base as $BASE_TAG"
  local ctr ca=()
  [ -s "$HOST_CA" ] && ca=(--env "PIP_CERT=$HOST_CA")
  ctr=$(buildah from --quiet scratch 2>"$CACHE/import.log") \
    || cannot "buildah cannot create a container (log: $CACHE/import.log)"
  if ! { buildah add --quiet "$ctr" "$BASE_TAR" / \
    && { [ ! -s "$HOST_CA" ] || buildah add --quiet "$ctr" "$HOST_CA" "$HOST_CA"; } \
    && buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      "${ca[@]}" --cmd /bin/bash "$ctr" \
    && buildah commit --quiet --rm "$ctr" "$BASE_TAG"; } >>"$CACHE/import.log" 2>&1; then
    buildah rm "$ctr" >/dev/null 2>&1
    cannot "buildah cannot import the base (log: $CACHE/import.log)"
  fi
}

# A build step is a `buildah run`: where that cannot work (no mount rights in an unprivileged
# container, say) it is this machine, not the Dockerfile.
can_run() {
  local ctr ok=0
  ctr=$(buildah from --quiet --pull=never "$BASE_TAG" 2>"$CACHE/run-check.log") || return 1
  buildah run --isolation chroot "$ctr" -- python3 -c 'import venv' >>"$CACHE/run-check.log" 2>&1 \
    || ok=1
  buildah rm "$ctr" >/dev/null 2>&1
  return $ok
}

index_reachable() {
  python3 - <<'EOF' >/dev/null 2>&1
import urllib.request
urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=15)
EOF
}

install_tools
make_base
can_run || cannot "buildah cannot run a command in the base (log: $CACHE/run-check.log)"
index_reachable || cannot "the package index https://pypi.org is out of reach (pip needs it)"

say "building $TAG from Dockerfile on $BASE_TAG (log: $CACHE/build.log)"
iid_file="$CACHE/image.iid"
rm -f "$iid_file"
# Docker format: OCI images drop HEALTHCHECK.
if ! buildah bud --isolation chroot --layers --force-rm --pull=never --format docker \
  --build-arg "BASE=$BASE_TAG" --iidfile "$iid_file" -t "$TAG" -f Dockerfile . \
  >"$CACHE/build.log" 2>&1; then
  last=$(grep -v '^[[:space:]]*$' "$CACHE/build.log" | tail -n 1)
  failed "the build failed: ${last:-no output} (log: $CACHE/build.log)"
fi
iid=$(cat "$iid_file") || failed "buildah wrote no image id ($iid_file)"
echo "${iid#sha256:}"
