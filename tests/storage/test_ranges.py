"""coalesce() against a bytewise reference, and RangeReader on every backend."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnn_faas.errors import CorruptBlob
from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.ranges import RangeReader, coalesce
from tests.storage.backend_suite import blob, random_ranges, slices

PROPERTY = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def range_sets(draw, min_size: int = 1):
    """Non-empty byte ranges of a blob of up to 400 bytes, clustered so that
    overlaps, touches and small gaps all occur."""
    n = draw(st.integers(min_size, 25))
    start = st.integers(0, 300)
    length = st.integers(1, 60)
    starts = np.array(draw(st.lists(start, min_size=n, max_size=n)), dtype=np.int64)
    ends = starts + np.array(draw(st.lists(length, min_size=n, max_size=n)), dtype=np.int64)
    return starts, ends


def union_mask(starts: np.ndarray, ends: np.ndarray, size: int) -> np.ndarray:
    """Naive reference: a flag per byte, set when some range covers it."""
    mask = np.zeros(size, dtype=bool)
    for s, e in zip(starts, ends, strict=True):
        mask[s:e] = True
    return mask


def runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Maximal runs of set flags as ``[start, end)`` ranges."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


@PROPERTY
@given(ranges=range_sets(), overhead=st.sampled_from([0.0, 0.01, 0.05, 0.2, 1.0, 10.0]))
def test_coalesce_against_bytewise_reference(ranges, overhead):
    starts, ends = ranges
    plan = coalesce(starts, ends, overhead)
    mask = union_mask(starts, ends, 400)
    needed = int(mask.sum())
    assert plan.needed_bytes == needed
    # merged ranges are sorted, disjoint and never touch (touching ones merge always)
    assert np.all(plan.starts < plan.ends)
    assert np.all(plan.ends[:-1] < plan.starts[1:])
    # they cover every requested byte, and the extra bytes stay within the budget
    covered = union_mask(plan.starts, plan.ends, 400)
    assert not np.any(mask & ~covered)
    extra = plan.read_bytes - needed
    assert 0 <= extra <= overhead * needed
    # no gap left open would still have fitted in the budget (smallest first)
    gaps = plan.starts[1:] - plan.ends[:-1]
    if gaps.size:
        assert gaps.min() > overhead * needed - extra
    if overhead == 0:
        ref_s, ref_e = runs(mask)
        np.testing.assert_array_equal(plan.starts, ref_s)
        np.testing.assert_array_equal(plan.ends, ref_e)
    # offsets locate every input range inside the concatenated merged bytes
    data = np.random.default_rng(0).integers(0, 256, 400, dtype=np.uint8)
    merged = np.concatenate([data[s:e] for s, e in zip(plan.starts, plan.ends, strict=True)])
    for s, e, off in zip(starts, ends, plan.offsets, strict=True):
        np.testing.assert_array_equal(merged[off : off + e - s], data[s:e])


def test_coalesce_merges_adjacent_and_overlapping_always():
    plan = coalesce(np.array([30, 0, 10, 5, 50]), np.array([40, 10, 20, 8, 60]), 0.0)
    np.testing.assert_array_equal(plan.starts, [0, 30, 50])
    np.testing.assert_array_equal(plan.ends, [20, 40, 60])
    np.testing.assert_array_equal(plan.offsets, [20, 0, 10, 5, 30])
    assert plan.needed_bytes == 40 and plan.read_bytes == 40


def test_coalesce_spends_the_budget_on_the_smallest_gaps():
    # gaps of 10, 2 and 5 bytes between four 100-byte ranges: a 2% budget (8 bytes)
    # closes the 2- and 5-byte gaps only
    starts = np.array([0, 110, 212, 317])
    plan = coalesce(starts, starts + 100, 0.02)
    np.testing.assert_array_equal(plan.starts, [0, 110])
    np.testing.assert_array_equal(plan.ends, [100, 417])
    assert plan.read_bytes - plan.needed_bytes == 7


def test_coalesce_of_nothing():
    plan = coalesce(np.empty(0, np.int64), np.empty(0, np.int64), 0.05)
    assert plan.starts.size == 0 and plan.needed_bytes == 0 and plan.read_bytes == 0


def test_range_reader_on_every_backend(store_uri):
    data = blob(20_000, seed=1)
    with open_backend(store_uri) as store:
        store.pipe_file("r.bin", data)
        reader = RangeReader(store)
        assert reader.overhead == store.coalesce_overhead
        rng = np.random.default_rng(2)
        for n in (1, 5, 40, 300):
            starts, ends = random_ranges(rng, len(data), n)
            before = reader.stats.round_trips
            got = reader.read("r.bin", starts, ends)
            assert got.tobytes() == slices(data, starts, ends)
            assert reader.stats.round_trips == before + (1 if np.any(ends > starts) else 0)
        st_ = reader.stats
        assert st_.bytes_needed <= st_.bytes_read <= (1 + reader.overhead) * st_.bytes_needed
        if store.coalesce_overhead == 0:
            assert st_.bytes_read == st_.bytes_needed
        # nothing to read: no round trip
        before = reader.stats.round_trips
        assert reader.read("r.bin", np.array([5, 9]), np.array([5, 9])).size == 0
        assert reader.stats.round_trips == before


@pytest.mark.parametrize("overhead", [0.0, 0.05])
def test_range_reader_reports_a_short_read(tmp_path, overhead):
    with open_backend(str(tmp_path)) as store:
        store.pipe_file("r.bin", blob(100))
        reader = RangeReader(store, overhead=overhead)
        with pytest.raises(CorruptBlob, match="r.bin"):
            reader.read("r.bin", np.array([10, 90]), np.array([20, 120]))
