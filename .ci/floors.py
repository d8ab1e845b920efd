"""Print pyproject.toml's dependency floors as pip constraints (`make test-floors` installs them).

Why: a `>=` bound nobody installed is a guess. `make test-floors` installs every dependency at
its floor -- the core list and the dev extra, each `>=X` turned into `==X` -- and runs a subset
of the suite there, so the lowest versions pyproject.toml admits are versions a test ran with
(constraints.txt pins the other end, the newest, that `make test` runs).

Usage: python .ci/floors.py [pyproject.toml] > floors.txt
Only lower bounds are read; a requirement without one (none today) is left to pip. Extras are
dropped (a constraint cannot carry them); a package named twice keeps its highest floor.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: `make test-floors` installs tomli first
    import tomli as tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

EXTRAS = ("dev",)  # the extra the tests install; the others are subsets of it


def floors(pyproject: Path) -> dict[str, tuple[Version, str]]:
    """Map each package to its highest `>=` bound (and marker) over the core and dev lists."""
    project = tomllib.loads(pyproject.read_text())["project"]
    lines = list(project["dependencies"])
    for extra in EXTRAS:
        lines += project["optional-dependencies"][extra]
    out: dict[str, tuple[Version, str]] = {}
    for line in lines:
        req = Requirement(line)
        lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
        if not lows:
            continue
        name = canonicalize_name(req.name)
        low = max(lows)
        if name not in out or low > out[name][0]:
            out[name] = (low, f"; {req.marker}" if req.marker else "")
    return out


def main(argv: list[str]) -> None:
    """Write the constraints, one `name==floor` a line, sorted, to stdout."""
    pyproject = Path(argv[1] if len(argv) > 1 else "pyproject.toml")
    print(f"# the floors of {pyproject} (core and {', '.join(EXTRAS)}): .ci/floors.py")
    for name, (low, marker) in sorted(floors(pyproject).items()):
        print(f"{name}=={low}{marker}")


if __name__ == "__main__":
    main(sys.argv)
