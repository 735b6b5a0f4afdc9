"""The range planner against a bytewise reference and a brute-force optimum, and
RangeReader on every backend."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnn_faas.errors import CorruptBlob
from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.ranges import ByteBudget, RangeReader, coalesce, plan_cost
from gnn_faas.storage.request_cost import RequestCost, constants_for
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


MAX_GAPS = st.sampled_from([0.0, 1.0, 5.0, 20.0, 100.0, math.inf])


def gap_rule_reference(mask: np.ndarray, max_gap: float) -> tuple[np.ndarray, np.ndarray]:
    """Naive reference of the rule: the union's runs, then a gap closed when
    shorter than ``max_gap``, one gap at a time."""
    rs, re = runs(mask)
    out_s, out_e = [int(rs[0])], [int(re[0])]
    for s, e in zip(rs[1:], re[1:], strict=True):
        if s - out_e[-1] < max_gap:
            out_e[-1] = int(e)
        else:
            out_s.append(int(s))
            out_e.append(int(e))
    return np.array(out_s), np.array(out_e)


@PROPERTY
@given(ranges=range_sets(), max_gap=MAX_GAPS)
def test_coalesce_against_bytewise_reference(ranges, max_gap):
    starts, ends = ranges
    plan = coalesce(starts, ends, max_gap)
    mask = union_mask(starts, ends, 400)
    assert plan.needed_bytes == int(mask.sum())
    # merged ranges are sorted, disjoint and never touch (touching ones merge always)
    assert np.all(plan.starts < plan.ends)
    assert np.all(plan.ends[:-1] < plan.starts[1:])
    # they cover every requested byte; every gap left open is at least max_gap
    covered = union_mask(plan.starts, plan.ends, 400)
    assert not np.any(mask & ~covered)
    assert np.all(plan.starts[1:] - plan.ends[:-1] >= max_gap)
    ref_s, ref_e = gap_rule_reference(mask, max_gap)
    np.testing.assert_array_equal(plan.starts, ref_s)
    np.testing.assert_array_equal(plan.ends, ref_e)
    # offsets locate every input range inside the concatenated merged bytes
    data = np.random.default_rng(0).integers(0, 256, 400, dtype=np.uint8)
    merged = np.concatenate([data[s:e] for s, e in zip(plan.starts, plan.ends, strict=True)])
    for s, e, off in zip(starts, ends, plan.offsets, strict=True):
        np.testing.assert_array_equal(merged[off : off + e - s], data[s:e])


def cheapest_partition(mask: np.ndarray, cost: RequestCost) -> float:
    """Brute force over every set of closed gaps between the union's runs:
    the cheapest plan the docstring's argument reduces the problem to."""
    rs, re = runs(mask)
    gaps = rs[1:] - re[:-1]
    best = math.inf
    for closed in itertools.product((False, True), repeat=gaps.size):
        closed = np.array(closed, dtype=bool)
        requests = rs.size - int(closed.sum())
        nbytes = int(mask.sum()) + int(gaps[closed].sum())
        best = min(best, cost.cost(requests, nbytes))
    return best


@PROPERTY
@given(
    ranges=range_sets(),
    per_request=st.floats(0.0, 1e3, allow_nan=False),
    per_byte=st.floats(0.0, 10.0, allow_nan=False),
)
def test_planned_cost_is_never_worse_than_no_or_full_merging(ranges, per_request, per_byte):
    starts, ends = ranges
    cost = RequestCost("t", per_request, per_byte, round_trip_s=1.0)
    plan = coalesce(starts, ends, cost.max_gap)
    planned = plan_cost(plan, cost)
    mask = union_mask(starts, ends, 400)
    hull = np.flatnonzero(mask)
    unmerged = cost.cost(runs(mask)[0].size, int(mask.sum()))
    merged = cost.cost(1, int(hull[-1] + 1 - hull[0]))
    tol = 1e-9 * max(1.0, abs(planned))
    assert planned <= unmerged + tol
    assert planned <= merged + tol
    if runs(mask)[0].size <= 10:  # and it is the optimum over every plan
        assert planned <= cheapest_partition(mask, cost) + tol


def test_coalesce_hand_cases():
    # four 100-byte ranges with gaps of 10, 2 and 5 bytes; a request costs as
    # much as 6 bytes: closing the 2- and 5-byte gaps pays, the 10-byte one not
    starts = np.array([0, 110, 212, 317])
    cost = RequestCost("t", per_request_s=6.0, per_byte_s=1.0)
    assert cost.max_gap == 6.0
    plan = coalesce(starts, starts + 100, cost.max_gap)
    np.testing.assert_array_equal(plan.starts, [0, 110])
    np.testing.assert_array_equal(plan.ends, [100, 417])
    # 2 requests + 407 bytes = 419, against 4·6 + 400 = 424 unmerged and 6 + 417 = 423 merged
    assert plan_cost(plan, cost) == 419.0
    assert plan_cost(coalesce(starts, starts + 100, 0.0), cost) == 424.0
    assert plan_cost(coalesce(starts, starts + 100, math.inf), cost) == 423.0
    # a gap exactly at the break-even stays open (both plans cost the same)
    plan = coalesce(np.array([0, 16]), np.array([10, 20]), 6.0)
    assert plan.starts.size == 2
    # bytes free (per_byte 0): one request; requests free: only overlaps and touches merge
    assert RequestCost("t", 1.0, 0.0).max_gap == math.inf
    assert RequestCost("t", 0.0, 1.0).max_gap == 0.0


def test_coalesce_merges_adjacent_and_overlapping_always():
    plan = coalesce(np.array([30, 0, 10, 5, 50]), np.array([40, 10, 20, 8, 60]), 0.0)
    np.testing.assert_array_equal(plan.starts, [0, 30, 50])
    np.testing.assert_array_equal(plan.ends, [20, 40, 60])
    np.testing.assert_array_equal(plan.offsets, [20, 0, 10, 5, 30])
    assert plan.needed_bytes == 40 and plan.read_bytes == 40


def test_coalesce_of_nothing():
    plan = coalesce(np.empty(0, np.int64), np.empty(0, np.int64), 100.0)
    assert plan.starts.size == 0 and plan.needed_bytes == 0 and plan.read_bytes == 0


def test_range_reader_on_every_backend(store_uri):
    data = blob(20_000, seed=1)
    with open_backend(store_uri) as store:
        store.pipe_file("r.bin", data)
        reader = RangeReader(store)
        assert reader.cost == constants_for(store)
        max_gap = reader.cost.max_gap
        rng = np.random.default_rng(2)
        requested = 0
        for n in (1, 5, 40, 300):
            starts, ends = random_ranges(rng, len(data), n)
            before = reader.stats.round_trips
            got = reader.read("r.bin", starts, ends)
            assert got.tobytes() == slices(data, starts, ends)
            assert reader.stats.round_trips == before + (1 if np.any(ends > starts) else 0)
            kept = ends > starts
            budget = reader.max_overread * int((ends - starts)[kept].sum())
            plan = coalesce(starts[kept], ends[kept], max_gap, budget)
            assert reader.stats.ranges_requested - requested == plan.starts.size
            requested = reader.stats.ranges_requested
        st_ = reader.stats
        assert st_.bytes_needed <= st_.bytes_read
        # with requests free, exactly the needed bytes are read
        free = RangeReader(store, RequestCost("t", 0.0, 1.0))
        starts, ends = random_ranges(rng, len(data), 50)
        free.read("r.bin", starts, ends)
        assert free.stats.bytes_read == free.stats.bytes_needed
        # nothing to read: no round trip
        before = reader.stats.round_trips
        assert reader.read("r.bin", np.array([5, 9]), np.array([5, 9])).size == 0
        assert reader.stats.round_trips == before


@pytest.mark.parametrize("max_gap", [0.0, 50.0])
def test_range_reader_reports_a_short_read(tmp_path, max_gap):
    with open_backend(str(tmp_path)) as store:
        store.pipe_file("r.bin", blob(100))
        reader = RangeReader(store, RequestCost("t", max_gap, 1.0))
        with pytest.raises(CorruptBlob, match="r.bin"):
            reader.read("r.bin", np.array([10, 90]), np.array([20, 120]))


def test_a_byte_budget_merges_the_smallest_profitable_gaps_first():
    # ranges of 10 bytes with gaps 50, 5, 30, 500 (max_gap 100: the last never pays)
    starts = np.array([0, 60, 75, 115, 625])
    ends = starts + 10
    unbounded = coalesce(starts, ends, 100.0)
    assert unbounded.starts.tolist() == [0, 625]  # gaps 50, 5, 30 merged
    # 40 extra bytes: the gaps of 5 and 30 (35 bytes), not the 50 (85 > 40)
    bounded = coalesce(starts, ends, 100.0, max_extra_bytes=40)
    assert bounded.starts.tolist() == [0, 60, 625]
    assert bounded.read_bytes - bounded.needed_bytes == 35
    # nothing to spare: only touching ranges merge
    assert coalesce(starts, ends, 100.0, max_extra_bytes=0).starts.size == 5


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), st.integers(0, 40)), min_size=1, max_size=9),
       st.floats(0, 200), st.integers(0, 300))  # fmt: skip
def test_the_budgeted_plan_is_the_cheapest_within_its_budget(pairs, max_gap, budget):
    starts = np.array([a for a, _ in pairs])
    ends = starts + np.array([b for _, b in pairs]) + 1
    plan = coalesce(starts, ends, max_gap, budget)
    assert plan.read_bytes - plan.needed_bytes <= budget
    # brute force over the gaps of the union: the fewest requests within the budget
    union = coalesce(starts, ends, 0.0)
    gaps = union.starts[1:] - union.ends[:-1]
    best = union.starts.size
    for mask in range(1 << gaps.size):
        chosen = [i for i in range(gaps.size) if mask >> i & 1]
        if all(gaps[i] < max_gap for i in chosen) and sum(gaps[i] for i in chosen) <= budget:
            best = min(best, union.starts.size - len(chosen))
    assert plan.starts.size == best


def test_a_budget_over_several_reads_spends_a_promise_early():
    # ranges of 10 bytes with gaps of 40: each merge saves one request for 40 bytes
    starts = np.arange(5) * 50
    ends = starts + 10
    # alone, a read of 50 needed bytes may move 50 more: one gap merged
    assert coalesce(starts, ends, 1e9, ByteBudget(1.0).allowance).starts.size == 4
    # with 110 bytes promised to a later read, this one may spend 160: all 4 gaps
    budget = ByteBudget(1.0)
    budget.promise(110)
    plan = coalesce(starts, ends, 1e9, budget.allowance)
    assert plan.starts.size == 1 and plan.read_bytes == 210
    budget.spend(plan.needed_bytes, plan.read_bytes - plan.needed_bytes)
    # the promised read: 160 of the 50 + 110 needed are spent, nothing is left
    budget.settle()
    assert budget.allowance(110) == 0.0
    later = coalesce(np.array([0, 20]), np.array([10, 110]), 1e9, budget.allowance)
    assert later.starts.size == 2 and later.needed_bytes == 100
    # a floor: a structure-only budget may always move that many bytes
    assert ByteBudget(1.0, floor=1000).allowance(10) == 1000


@PROPERTY
@given(st.lists(st.tuples(range_sets(), st.floats(0, 400)), min_size=1, max_size=5),
       st.floats(0, 2))  # fmt: skip
def test_a_shared_budget_bounds_the_extra_bytes_of_all_its_reads(reads, fraction):
    budget = ByteBudget(fraction)
    needed = extra = 0
    for (starts, ends), _ in reads:
        plan = coalesce(starts, ends, 1e9, budget.allowance)
        budget.spend(plan.needed_bytes, plan.read_bytes - plan.needed_bytes)
        needed += plan.needed_bytes
        extra += plan.read_bytes - plan.needed_bytes
    assert extra == budget.extra and needed == budget.needed
    assert extra <= fraction * needed + 1e-6


def test_a_reader_spends_a_shared_budget(tmp_path):
    with open_backend(str(tmp_path)) as store:
        data = blob(1000, seed=3)
        store.pipe_file("r.bin", data)
        reader = RangeReader(store, RequestCost("t", 1.0, 1e-9))
        budget = ByteBudget(1.0)
        starts = np.array([0, 100, 200, 300])
        got = reader.read("r.bin", starts, starts + 10, budget)
        assert got.tobytes() == slices(data, starts, starts + 10)
        # 40 needed, 40 to spare: no gap of 90 fits, four requests
        assert reader.stats.ranges_requested == 4 and budget.extra == 0
        got = reader.read("r.bin", starts + 50, starts + 60, budget)
        assert got.tobytes() == slices(data, starts + 50, starts + 60)
        # 80 needed so far: 80 to spare, still no pair of gaps of 90
        assert reader.stats.ranges_requested == 8 and budget.needed == 80
        budget.promise(200)
        reader.read("r.bin", starts + 20, starts + 30, budget)
        # 120 + 200 promised: 3 gaps of 90 (270 <= 320) merged into one request
        assert reader.stats.ranges_requested == 9 and budget.extra == 270
