"""Delete the byte code of the modules a function never imports, to keep its image small.

    python scripts/prune_bytecode.py SITE_PACKAGES MODULE [MODULE ...]

Imports every MODULE (what the function loads when it starts, and what it may load
later, e.g. its storage clients), then removes the ``__pycache__`` directories of
SITE_PACKAGES whose package directory no loaded module lives in (scipy's stats,
optimize, signal, ... for the memory function). Nothing else goes: a module whose
byte code was removed still imports (compiled in memory, as the root filesystem is
read-only), only more slowly, so this trims size, never function. ``gnn_faas``
keeps all of its byte code. Prints the megabytes removed.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys


def main(argv: list[str]) -> int:
    site, modules = os.path.realpath(argv[0]), argv[1:]
    for name in modules:
        importlib.import_module(name)
    loaded = {
        os.path.dirname(os.path.realpath(f))
        for m in list(sys.modules.values())
        if (f := getattr(m, "__file__", None))
    }
    removed = 0
    for d, dirs, files in os.walk(site):
        if os.path.basename(d) != "__pycache__":
            continue
        pkg = os.path.dirname(d)
        if pkg in loaded or os.path.relpath(pkg, site).split(os.sep)[0] == "gnn_faas":
            continue
        removed += sum(os.path.getsize(os.path.join(d, f)) for f in files)
        shutil.rmtree(d)
        dirs.clear()
    print(f"prune_bytecode: removed {removed / 1e6:.1f} MB of byte code never imported")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
