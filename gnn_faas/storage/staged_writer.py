"""Write a graph blob by blob, chunk by chunk, and publish it with the manifest last.

:func:`~gnn_faas.storage.format.write_graph` needs every array in memory at
once; a graph whose features alone are 5 GB cannot be written that way. A
:class:`StagedGraphWriter` takes each blob as a sequence of chunks, hashes
them as they pass (sha256 is incremental) and writes them to a *staging*
directory; :meth:`StagedGraphWriter.publish` moves the finished blobs under the
graph's prefix and writes ``manifest.json`` last, so a reader sees either the
old graph, no graph, or the whole new one. :meth:`StagedGraphWriter.abort`
(called on any exception, ``KeyboardInterrupt`` and ``SystemExit`` included)
removes the staging directory: an interrupted run leaves nothing behind.

On a file store the staging directory lies inside the store root
(``.tmp-stage-NAME-PID``: the backend's listing hides ``.tmp-`` keys), so
publishing is a rename per blob. On other stores (S3, Redis) blobs are staged
in a local temporary directory and uploaded by ``pipe_file`` from a memory
map at publish; the bounded memory of a streamed write holds for file stores.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from gnn_faas.storage.backends import StorageBackend, open_backend
from gnn_faas.storage.backends.file import FileBackend
from gnn_faas.storage.format import MANIFEST, BlobDigester, BlobInfo, Manifest, validate_name


class BlobStream:
    """One blob being written: chunks of one dtype appended in row order."""

    def __init__(self, path: Path, key: str, dtype: str, shape: tuple[int, ...]):
        self.key = key
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.shape = tuple(int(s) for s in shape)
        self.expected = int(self.dtype.itemsize * int(np.prod(self.shape, dtype=np.int64)))
        self.path = path
        self._fh = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._digest = BlobDigester(self.expected)
        self.nbytes = 0

    def write(self, chunk: np.ndarray) -> None:
        arr = np.ascontiguousarray(chunk, dtype=self.dtype)
        data = memoryview(arr).cast("B")
        self._digest.update(data)
        self._fh.write(data)
        self.nbytes += arr.nbytes

    def close(self) -> BlobInfo:
        self._fh.close()
        if self.nbytes != self.expected:
            raise ValueError(
                f"blob {self.key!r}: wrote {self.nbytes} bytes, its shape {self.shape} needs "
                f"{self.expected}"
            )
        digests = self._digest.chunk_digests()
        info = BlobInfo(
            file=f"{self.key}.bin",
            dtype=self.dtype.str,
            shape=self.shape,
            nbytes=self.nbytes,
            sha256=self._digest.whole.hexdigest(),
            chunk_bytes=self._digest.chunk_bytes,
            chunks_sha256=hashlib.sha256(digests).hexdigest(),
        )
        self.path.with_name(info.chunks_file).write_bytes(digests)
        return info

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self._fh.close()


class StagedGraphWriter:
    """Stage blobs of graph ``name``, then :meth:`publish` (or :meth:`abort`).

    Use as a context manager: leaving the block by an exception aborts.
    """

    def __init__(self, store: StorageBackend | str, name: str, prefix: str | None = None):
        validate_name(name)
        self.backend = open_backend(store) if isinstance(store, str) else store
        self.name = name
        # where the blobs go: the graph's prefix, or a compacted base under it
        self.prefix = prefix or name
        if isinstance(self.backend, FileBackend):
            self.backend.root.mkdir(parents=True, exist_ok=True)
            self.stage = Path(
                tempfile.mkdtemp(prefix=f".tmp-stage-{name}-{os.getpid()}-", dir=self.backend.root)
            )
        else:
            self.stage = Path(tempfile.mkdtemp(prefix=f"gnn-faas-stage-{name}-"))
        self.blobs: dict[str, BlobInfo] = {}
        self._open: dict[str, BlobStream] = {}

    def __enter__(self) -> StagedGraphWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()

    def blob(self, key: str, dtype: str, shape: tuple[int, ...]) -> BlobStream:
        """Start blob ``key`` (``KEY.bin``); write its chunks, then :meth:`finish` it."""
        stream = BlobStream(self.stage / f"{key}.bin", key, dtype, shape)
        self._open[key] = stream
        return stream

    def finish(self, stream: BlobStream) -> BlobInfo:
        info = stream.close()
        self._open.pop(stream.key, None)
        self.blobs[stream.key] = info
        return info

    def write_array(self, key: str, arr: np.ndarray) -> BlobInfo:
        """A whole (small) array as blob ``key``."""
        stream = self.blob(key, np.asarray(arr).dtype.str, np.shape(arr))
        stream.write(arr)
        return self.finish(stream)

    def bytes_written(self) -> int:
        return sum(b.nbytes for b in self.blobs.values())

    def publish(
        self,
        *,
        num_nodes: int,
        num_edges: int,
        feature_dim: int,
        symmetrized: bool,
        num_classes: int = 0,
        extra: dict[str, Any] | None = None,
    ) -> Manifest:
        """Move the staged blobs under ``NAME/`` and write the manifest last."""
        if self._open:
            raise ValueError(f"blobs not finished: {', '.join(self._open)}")
        for key in ("indptr", "indices", "features"):
            if key not in self.blobs:
                raise ValueError(f"a graph needs a {key!r} blob")
        manifest = Manifest(
            name=self.name,
            num_nodes=int(num_nodes),
            num_edges=int(num_edges),
            feature_dim=int(feature_dim),
            symmetrized=bool(symmetrized),
            blobs=dict(self.blobs),
            num_classes=int(num_classes),
            extra=dict(extra or {}),
        )
        # the old manifest goes first: no reader pairs it with the new blobs
        self.backend.rm(f"{self.prefix}/{MANIFEST}")
        if isinstance(self.backend, FileBackend):
            target = self.backend.root / self.prefix
            target.mkdir(parents=True, exist_ok=True)
            for info in self.blobs.values():
                os.replace(self.stage / info.chunks_file, target / info.chunks_file)
                os.replace(self.stage / info.file, target / info.file)
            self.backend.close()  # drop memory maps of replaced blobs
        else:
            for info in self.blobs.values():
                self._upload(self.stage / info.chunks_file, f"{self.prefix}/{info.chunks_file}")
                self._upload(self.stage / info.file, f"{self.prefix}/{info.file}")
        self.backend.pipe_file(f"{self.prefix}/{MANIFEST}", manifest.to_json().encode())
        shutil.rmtree(self.stage, ignore_errors=True)
        return manifest

    def _upload(self, path: Path, key: str) -> None:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                self.backend.pipe_file(key, b"")
                return
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                self.backend.pipe_file(key, memoryview(mm))

    def abort(self) -> None:
        """Drop everything staged; the store is as it was."""
        for stream in self._open.values():
            stream.discard()
        self._open.clear()
        shutil.rmtree(self.stage, ignore_errors=True)
