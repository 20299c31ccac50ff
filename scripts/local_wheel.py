"""Print the path of a wheel for NAME==VERSION already on this machine, for scripts/setup.

Looks where pip itself would (`pip config list`: find-links directories and file:// indexes,
PIP_* variables included) and keeps only wheels this interpreter can install, so set-up never
tries a slow download (download.pytorch.org) that an offline machine cannot make when a local
copy exists. Prints nothing and exits 1 when there is none.

    python scripts/local_wheel.py torch 2.13.0            # runs `pip config list` itself
    pip config list | python scripts/local_wheel.py torch 2.13.0 --config -
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

_SETTING = re.compile(r"^\S*?\.(find-links|index-url|extra-index-url)='(.*)'$")


def pip_sources(config_text: str) -> list[tuple[str, str]]:
    """(setting, value) for every find-links / index URL in `pip config list` output."""
    found: list[tuple[str, str]] = []
    for line in config_text.splitlines():
        m = _SETTING.match(line.strip())
        if m:
            found += [(m.group(1), item) for item in m.group(2).split()]
    return found


def _local_dir(item: str) -> Path | None:
    if item.startswith("file:"):
        item = urllib.parse.unquote(urllib.parse.urlparse(item).path)
    elif "://" in item:
        return None  # a network index: not local
    path = Path(item)
    return path if path.is_dir() else None


def _compatible(filename: str, name: str, version: str) -> bool:
    from pip._vendor.packaging.tags import sys_tags
    from pip._vendor.packaging.utils import (
        InvalidWheelFilename,
        canonicalize_name,
        parse_wheel_filename,
    )

    try:
        wheel_name, wheel_version, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    if wheel_name != canonicalize_name(name) or wheel_version.public != version:
        return False
    return not tags.isdisjoint(set(sys_tags()))


def _candidates(kind: str, root: Path, name: str) -> list[Path]:
    if kind == "find-links":
        return sorted(root.glob("*.whl"))
    page = root / name / "index.html"  # a PEP 503 simple index: <root>/<name>/index.html
    if not page.is_file():
        return sorted((root / name).glob("*.whl")) if (root / name).is_dir() else []
    links = re.findall(r'href="([^"#]+)', page.read_text(errors="replace"))
    return [(page.parent / urllib.parse.unquote(link)).resolve() for link in links
            if link.endswith(".whl") and "://" not in link]


def find_local_wheel(name: str, version: str, config_text: str) -> Path | None:
    for kind, item in pip_sources(config_text):
        root = _local_dir(item)
        if root is None:
            continue
        for wheel in _candidates(kind, root, name):
            if wheel.is_file() and _compatible(wheel.name, name, version):
                return wheel
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name")
    parser.add_argument("version")
    parser.add_argument("--config", help="'-': read `pip config list` output from stdin")
    args = parser.parse_args()
    if args.config == "-":
        text = sys.stdin.read()
    else:
        run = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                             capture_output=True, text=True, env={**os.environ})
        text = run.stdout
    wheel = find_local_wheel(args.name, args.version, text)
    if wheel is None:
        return 1
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
