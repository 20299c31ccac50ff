#!/usr/bin/env bash
# A headless browser for tests/api/test_web_page.py: Debian's chromium, driven by Playwright (the
# `playwright` Python package comes with the test extras). Playwright never downloads a browser
# here: the test hands it this chromium through `executable_path`.
# Prints the browser's path (last line of stdout) when there is one. When it cannot install it
# (no apt-get, not root and no sudo, no package), it says why on stderr, prints no path and exits
# 0: the page tests then skip with that reason.
# Environment: PLANNER_CHROMIUM names a browser binary to use instead.
set -uo pipefail

say() { echo "setup_browser: $*" >&2; }
give_up() {
  say "$*; the browser tests will be skipped"
  exit 0
}

find_browser() {
  local b
  for b in "${PLANNER_CHROMIUM:-}" chromium chromium-browser google-chrome; do
    [ -n "$b" ] || continue
    if command -v "$b" >/dev/null 2>&1; then
      command -v "$b"
      return 0
    fi
  done
  return 1
}

if path=$(find_browser); then
  echo "$path"
  exit 0
fi

command -v apt-get >/dev/null 2>&1 || give_up "chromium is not installed and there is no apt-get"
sudo=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null \
    || give_up "chromium is not installed and apt-get needs root (no password-less sudo)"
  sudo=(sudo -n)
fi
say "installing chromium with apt-get (about 100 MB; a minute or two)"
export DEBIAN_FRONTEND=noninteractive
# An old or missing package list finds nothing: update it first.
"${sudo[@]}" apt-get update -qq >/dev/null 2>&1 || say "apt-get update failed; trying anyway"
if ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core \
    >/dev/null 2>&1; then
  give_up "apt-get install chromium failed"
fi
path=$(find_browser) || give_up "chromium was installed but no chromium binary is on PATH"
say "chromium installed: $path"
echo "$path"
