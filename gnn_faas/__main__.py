"""``python -m gnn_faas ...``: the ``gnn-faas`` command line (how the local
platform starts function instances with the interpreter it runs on)."""

import sys

from gnn_faas.cli import main

if __name__ == "__main__":
    sys.exit(main())
