"""A Bitcoin OTC store and a short window of the real Twitter trace mapped onto it."""

from __future__ import annotations

import pytest

from gnn_faas.storage.datasets import prepare_dataset
from gnn_faas.storage.format import open_graph


@pytest.fixture(scope="session")
def bitcoin_store(tmp_path_factory):
    store = f"file://{tmp_path_factory.mktemp('bitcoin-store')}"
    prepare_dataset(store, "bitcoin-otc", feature_dim=4)
    return store


@pytest.fixture(scope="session")
def bitcoin_graph(bitcoin_store):
    return open_graph(bitcoin_store, "bitcoin-otc")
