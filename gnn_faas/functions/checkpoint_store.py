"""Model checkpoints in the graph store, for functions that start in a cluster.

A checkpoint (``config.json`` + ``model.safetensors``, checkpoint.py) lives in
the store under ``_models/NAME/``, next to the graphs, so every pod that can
read the graph can read the model: the chart's prepare Job pushes it, the
compute functions' and the gateway's ``fetch-model`` init containers pull it
into an emptyDir. The weights are written before the config, so a reader
that finds ``config.json`` finds a whole checkpoint; pulled files land under
temporary names and are renamed. No torch here: bytes are copied as they are.
"""

from __future__ import annotations

import os
from pathlib import Path

from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.functions.checkpoint import CONFIG_FILE, WEIGHTS_FILE, load_config
from gnn_faas.storage.backends import StorageBackend, open_backend

PREFIX = "_models"
FILES = (WEIGHTS_FILE, CONFIG_FILE)  # order matters: config last


def _backend(store: StorageBackend | str) -> StorageBackend:
    return open_backend(store) if isinstance(store, str) else store


def _check_name(name: str) -> str:
    if not name or "/" in name or name.startswith("."):
        raise InvalidRequest(f"invalid model name {name!r}")
    return name


def push_checkpoint(store: StorageBackend | str, path: str | os.PathLike, name: str) -> int:
    """Copy the checkpoint at ``path`` into the store as ``_models/NAME/``;
    the bytes written."""
    load_config(path)  # a clear error for a directory that is no checkpoint
    backend, written = _backend(store), 0
    for f in FILES:
        p = Path(path) / f
        if not p.is_file():
            raise NotFound(f"no model checkpoint at {str(path)!r}: {f} is missing")
        data = p.read_bytes()
        backend.pipe_file(f"{PREFIX}/{_check_name(name)}/{f}", data)
        written += len(data)
    return written


def pull_checkpoint(store: StorageBackend | str, name: str, out: str | os.PathLike) -> Path:
    """Copy ``_models/NAME/`` from the store into directory ``out``."""
    backend = _backend(store)
    key = f"{PREFIX}/{_check_name(name)}"
    if not backend.exists(f"{key}/{CONFIG_FILE}"):
        raise NotFound(f"the store {backend.uri} holds no model {name!r} (no {key}/{CONFIG_FILE})")
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    for f in FILES:
        tmp = dest / (f + ".tmp")
        tmp.write_bytes(backend.cat_file(f"{key}/{f}"))
        os.replace(tmp, dest / f)
    load_config(dest)
    return dest
