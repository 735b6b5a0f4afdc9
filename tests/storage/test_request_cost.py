"""Measured storage constants: the fit, where a reader finds them, bad files."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from gnn_faas.bench import storage_constants as bench
from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.ranges import RangeReader
from gnn_faas.storage.request_cost import (
    STORE_KEY,
    RequestCost,
    constants_for,
    document,
    load_constants,
    parse_constants,
)


def test_fit_recovers_the_constants_of_a_linear_store():
    points = bench.design_points(16 << 20, 512)
    requests = np.array([s.size for s, _ in points], dtype=np.float64)
    nbytes = np.array([int((e - s).sum()) for s, e in points], dtype=np.float64)
    seconds = 0.002 + requests * 0.01 + nbytes * 5e-9  # an S3-like store
    rt, per_req, per_byte, r2 = bench.fit(requests, nbytes, seconds)
    assert rt == pytest.approx(0.002, rel=1e-6)
    assert per_req == pytest.approx(0.01, rel=1e-6)
    assert per_byte == pytest.approx(5e-9, rel=1e-6)
    assert r2 == pytest.approx(1.0)
    # the design separates requests from bytes: neither is a multiple of the other
    assert np.linalg.matrix_rank(np.column_stack([np.ones_like(requests), requests, nbytes])) == 3


def test_bundled_constants_cover_every_backend_and_name_their_command():
    costs = load_constants()
    assert {"file", "redis", "s3"} <= set(costs)
    for c in costs.values():
        assert c.measured["command"].startswith("gnn-faas bench storage-constants")
        assert c.per_request_s > 0 and c.per_byte_s > 0
    # a network request costs more bytes than a seek into a mapped file
    assert costs["s3"].max_gap > costs["file"].max_gap


def test_a_reader_prefers_the_constants_saved_in_its_store(tmp_path):
    with open_backend(str(tmp_path)) as store:
        assert constants_for(store) == load_constants()["file"]
    saved = RequestCost("file", 1e-3, 1e-9, 0.0, {"command": "gnn-faas bench storage-constants"})
    with open_backend(str(tmp_path)) as store:
        store.pipe_file(STORE_KEY, json.dumps(document({"file": saved})).encode())
    with open_backend(str(tmp_path)) as store:
        assert constants_for(store) == saved
        assert RangeReader(store).cost.max_gap == pytest.approx(1e6)


@pytest.mark.parametrize(
    "doc, match",
    [
        ({"format": "x"}, "not a gnn-faas-storage-constants"),
        ({"format": "gnn-faas-storage-constants", "version": 9}, "version"),
        ({"format": "gnn-faas-storage-constants", "version": 1, "backends": []}, "backends"),
        (
            {"format": "gnn-faas-storage-constants", "version": 1,
             "backends": {"s3": {"per_request_s": 1, "per_byte_s": 1, "measured": {}}}},
            "command",
        ),
        (
            {"format": "gnn-faas-storage-constants", "version": 1,
             "backends": {"s3": {"per_request_s": -1, "per_byte_s": 1,
                                 "measured": {"command": "c"}}}},
            "per_request_s",
        ),
        (
            {"format": "gnn-faas-storage-constants", "version": 1,
             "backends": {"s3": {"per_request_s": "x", "per_byte_s": 1,
                                 "measured": {"command": "c"}}}},
            "numbers",
        ),
    ],
)  # fmt: skip
def test_bad_constants_are_refused_with_a_reason(doc, match):
    with pytest.raises(InvalidRequest, match=match):
        parse_constants(doc, "f.json")


def test_a_corrupt_key_in_the_store_is_a_clear_error(tmp_path):
    with open_backend(str(tmp_path)) as store:
        store.pipe_file(STORE_KEY, b"{not json")
        with pytest.raises(InvalidRequest, match="not JSON"):
            constants_for(store)


def _args(store: str, **kw) -> argparse.Namespace:
    base = dict(store=store, blob_mib=1.0, small_bytes=256, repeats=1, seed=0, out=None,
                save=False, note=None)  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_bench_measures_saves_and_cleans_up(tmp_path):
    store = tmp_path / "store"
    out = tmp_path / "constants.json"
    other = RequestCost("s3", 0.01, 1e-8, 0.0, {"command": "gnn-faas bench storage-constants"})
    out.write_text(json.dumps(document({"s3": other}, "kept")))
    result = bench.run(_args(str(store), save=True, out=str(out)))
    assert result["backend"] == "file"
    assert result["per_request_s"] >= 0 and result["per_byte_s"] >= 0
    assert len(result["timings"]) == len(bench.design_points(1 << 20, 256))
    with open_backend(str(store)) as s:
        assert s.ls("") == [STORE_KEY]  # the probe is gone, the constants stay
        saved = constants_for(s)
    assert saved.per_request_s == result["per_request_s"]
    merged = load_constants(out)
    assert merged["s3"] == other and merged["file"] == saved
    assert json.loads(out.read_text())["note"] == "kept"
    assert math.isfinite(saved.cost(3, 1000))


def test_bench_refuses_bad_arguments(tmp_path):
    with pytest.raises(InvalidRequest, match="repeats"):
        bench.run(_args(str(tmp_path), repeats=0))
    with pytest.raises(InvalidRequest, match="too small"):
        bench.run(_args(str(tmp_path), blob_mib=0.01))
