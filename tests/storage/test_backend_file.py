"""The conformance suite on the local directory backend."""

from __future__ import annotations

import pytest

from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.backends.file import FileBackend
from tests.storage.backend_suite import BackendSuite


class TestFileBackend(BackendSuite):
    @pytest.fixture
    def backend(self, tmp_path):
        with FileBackend(f"file://{tmp_path / 'store'}") as store:
            yield store


def test_bare_path_means_file(tmp_path):
    store = open_backend(str(tmp_path))
    assert isinstance(store, FileBackend)
    store.pipe_file("k.bin", b"x")
    assert (tmp_path / "k.bin").read_bytes() == b"x"


def test_keys_cannot_escape_the_root(tmp_path):
    store = FileBackend(str(tmp_path / "store"))
    with pytest.raises(InvalidRequest, match="escapes"):
        store.pipe_file("../outside.bin", b"x")
    assert not (tmp_path / "outside.bin").exists()


def test_a_written_blob_is_on_disk_before_it_is_named_and_its_name_after(tmp_path, monkeypatch):
    """pipe_file and put_if_absent flush the data before the rename or link that
    names it, and the directory after: a version record (put_if_absent) is only
    written once the segment it names (pipe_file) is durable."""
    import os

    import gnn_faas.storage.backends.file as file_backend

    events: list[tuple[str, str]] = []
    real_fsync, real_replace, real_link = os.fsync, os.replace, os.link

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("name", str(dst)))
        return real_replace(src, dst)

    def link(src, dst):
        events.append(("name", str(dst)))
        return real_link(src, dst)

    monkeypatch.setattr(file_backend.os, "fsync", fsync)
    monkeypatch.setattr(file_backend.os, "replace", replace)
    monkeypatch.setattr(file_backend.os, "link", link)
    store = FileBackend(str(tmp_path / "store"))
    store.pipe_file("g/log/seg-1", b"segment")
    assert store.put_if_absent("g/versions/1", b"record")
    root = str(store.root)
    seg, rec = f"{root}/g/log/seg-1", f"{root}/g/versions/1"
    kinds = [(k, p.split(".tmp-")[0] if ".tmp-" in p else p) for k, p in events]
    i_name = kinds.index(("name", seg))
    assert ("fsync", seg) in kinds[:i_name]  # the data (its temporary file) first
    assert ("fsync", f"{root}/g/log") in kinds[i_name:]  # then the directory entry
    j_name = kinds.index(("name", rec))
    assert j_name > kinds.index(("fsync", f"{root}/g/log"))  # the record after the segment
    assert ("fsync", rec) in kinds[i_name:j_name]  # its own data before its name
    assert ("fsync", f"{root}/g/versions") in kinds[j_name:]
    assert store.cat_file("g/log/seg-1") == b"segment"
