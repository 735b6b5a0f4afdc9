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
