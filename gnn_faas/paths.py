"""Where things live on disk by default.

``shared_datasets_dir()``: the real datasets beside the repository
(``../shared/datasets``), or ``$GNN_FAAS_DATASETS``. ``var_dir()``: the
project's working directory for the embedded default (``./var`` or
``$GNN_FAAS_VAR``): the file store, trained models, logs. ``default_store()``:
the embedded default store, ``file://`` + ``var_dir()/store``.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BUNDLED_DATA = Path(__file__).resolve().parent / "data"


def shared_datasets_dir() -> Path:
    env = os.environ.get("GNN_FAAS_DATASETS")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "datasets"


def var_dir() -> Path:
    env = os.environ.get("GNN_FAAS_VAR")
    return Path(env) if env else Path.cwd() / "var"


def default_store() -> str:
    """The embedded default store: ``file://./var/store`` (or ``$GNN_FAAS_VAR/store``)."""
    return f"file://{var_dir() / 'store'}"
