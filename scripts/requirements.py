"""Print the requirements of gnn-faas with the given extras, one per line, from pyproject.toml.

    python3 scripts/requirements.py [PYPROJECT] [EXTRA,EXTRA...] [--exclude NAME,NAME]

scripts/lock.py compiles each install target's lock file from these (the images and the
venv install the locks, not these ranges). Extras that name the project itself
(``gnn-faas[compute,s3]``) are expanded. Standard library only (tomllib: Python >= 3.11).
"""

from __future__ import annotations

import re
import sys

import tomllib


def requirements(pyproject: dict, extras: list[str], exclude: set[str]) -> list[str]:
    project = pyproject["project"]
    own = project["name"]
    optional = project.get("optional-dependencies", {})
    out: list[str] = []
    seen: set[str] = set()

    def add(req: str) -> None:
        name = re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower()
        if name == own:
            inner = re.search(r"\[([^\]]*)\]", req)
            for extra in inner.group(1).split(",") if inner else []:
                add_extra(extra.strip())
            return
        if name in exclude or req in seen:
            return
        seen.add(req)
        out.append(req)

    def add_extra(extra: str) -> None:
        if extra not in optional:
            raise SystemExit(f"unknown extra {extra!r}; known: {sorted(optional)}")
        for req in optional[extra]:
            add(req)

    for req in project.get("dependencies", []):
        add(req)
    for extra in extras:
        add_extra(extra)
    return out


def main(argv: list[str]) -> int:
    exclude: set[str] = set()
    if "--exclude" in argv:
        i = argv.index("--exclude")
        exclude = {n.strip().lower() for n in argv[i + 1].split(",") if n.strip()}
        argv = argv[:i] + argv[i + 2 :]
    path = argv[0] if argv else "pyproject.toml"
    extras = [e.strip() for e in (argv[1] if len(argv) > 1 else "").split(",") if e.strip()]
    with open(path, "rb") as f:
        print("\n".join(requirements(tomllib.load(f), extras, exclude)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
