"""The graph version a call carries (gnn_faas/graph_version.py)."""

from __future__ import annotations

import pytest

from gnn_faas import graph_version


def test_the_header_carries_the_rows_version_only_when_older():
    with graph_version.scope(7, 3):
        assert (graph_version.get(), graph_version.rows()) == (7, 3)
        sent = graph_version.header_value()
        assert sent == "7/3"
        assert graph_version.from_header(sent) == (7, 3)
    with graph_version.scope(7):
        assert graph_version.header_value() == "7"
        assert graph_version.from_header("7") == (7, 7)
        assert graph_version.rows() == 7
    with graph_version.scope(7, 9):  # never newer than the version itself
        assert graph_version.rows() == 7
    with graph_version.scope(None):
        assert graph_version.get() is graph_version.rows() is graph_version.header_value() is None


@pytest.mark.parametrize(
    "value", [None, "", "x", "-1", "3/5", "3/", "/3", "3/x", "1" * 19, "3/4/5"]
)
def test_a_malformed_header_is_no_version(value):
    assert graph_version.from_header(value) == (None, None)
