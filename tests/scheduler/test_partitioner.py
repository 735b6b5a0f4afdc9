"""Per-layer partitioning (λGrapher Algorithm 2) on real Bitcoin OTC computation graphs."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest
from gnn_faas.scheduler.merge import merge_computation_graphs
from gnn_faas.scheduler.partitioner import partition_layer, plan_partitions
from gnn_faas.scheduler.sizing.function_memory import EDGE_BYTES, MIB
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import open_graph
from tests.scheduler.test_merge import request_stream, write_bitcoin_store

RUNTIME = 4096


@pytest.fixture(scope="module")
def merged_cg(tmp_path_factory):
    uri, _ = write_bitcoin_store(tmp_path_factory.mktemp("store"))
    fetcher = KHopFetcher(open_graph(uri, "bitcoin-otc"))
    requests = request_stream(fetcher, 10, seed=11)
    return merge_computation_graphs([fetcher.fetch(t, 2) for t in requests]).graph


def part_memory(block, a, b, rb_in, rb_out, include_self=True):
    """The formula, evaluated directly with Python sets (reference)."""
    cols = set(block.indices[block.indptr[a] : block.indptr[b]].tolist())
    if include_self:
        cols |= set(range(a, b))
    edges = int(block.indptr[b] - block.indptr[a])
    return RUNTIME + len(cols) * rb_in + edges * EDGE_BYTES + (b - a) * rb_out


def check_cover(parts, n):
    assert parts[0][0] == 0 and parts[-1][1] == n
    for (a, b), (c, _) in zip(parts, parts[1:], strict=False):
        assert a < b == c


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("budget", [20_000, 60_000, 250_000])
def test_parts_fit_cover_and_are_maximal(merged_cg, budget, include_self):
    block = merged_cg.block(1)
    rb_in, rb_out = 64 * 4, 16 * 4
    parts = partition_layer(block, rb_in, rb_out, budget, RUNTIME, include_self=include_self)
    check_cover(parts, block.num_dst)
    assert len(parts.memory_bytes) == len(parts)
    for i, (a, b) in enumerate(parts):
        mem = part_memory(block, a, b, rb_in, rb_out, include_self)
        assert mem == parts.memory_bytes[i]
        if i in parts.oversized:
            assert b - a == 1 and mem > budget
        else:
            assert mem <= budget
        if b < block.num_dst:  # greedy: one more row would not fit
            assert part_memory(block, a, b + 1, rb_in, rb_out, include_self) > budget


def test_fewer_parts_as_budget_grows(merged_cg):
    block = merged_cg.block(1)
    counts = [
        len(partition_layer(block, 512, 512, budget, RUNTIME))
        for budget in (30_000, 100_000, 400_000, 2_000_000, 50_000_000)
    ]
    assert all(x >= y for x, y in zip(counts, counts[1:], strict=False))
    assert counts[0] > counts[-1] == 1


def test_oversized_row_is_its_own_flagged_part(merged_cg):
    block = merged_cg.block(1)
    deg = np.diff(block.indptr)
    hub = int(np.argmax(deg))
    # Budget below the hub row alone, above most other rows.
    budget = part_memory(block, hub, hub + 1, 128, 128) - 1
    parts = partition_layer(block, 128, 128, budget, RUNTIME)
    check_cover(parts, block.num_dst)
    assert (hub, hub + 1) in parts
    flagged = [parts[i] for i in parts.oversized]
    assert (hub, hub + 1) in flagged
    assert all(b - a == 1 for a, b in flagged)


def test_plan_partitions_per_layer(merged_cg):
    dims = [(128, 64), (64, 2)]
    plan = plan_partitions(merged_cg, dims, memory_mb=1, runtime_mb=0)
    assert len(plan) == merged_cg.num_layers
    for layer, parts in enumerate(plan, start=1):
        check_cover(parts, merged_cg.layer_sizes[layer])
        assert all(m <= MIB for i, m in enumerate(parts.memory_bytes) if i not in parts.oversized)
    big = plan_partitions(merged_cg, dims, memory_mb=512, runtime_mb=96)
    assert [len(p) for p in big] == [1, 1]
    with pytest.raises(InvalidRequest):
        plan_partitions(merged_cg, dims[:1], memory_mb=512, runtime_mb=96)


def test_bad_budget(merged_cg):
    with pytest.raises(InvalidRequest):
        partition_layer(merged_cg.block(1), 4, 4, 0, 0)


def test_whole_only_answers_one_part_or_none_without_the_scan(merged_cg):
    """A layer that fits whole is the same single part either way; one that does
    not is ``None`` under ``whole_only`` (the scan would cut it)."""
    block = merged_cg.block(1)
    whole = part_memory(block, 0, block.num_dst, 128, 128)
    roomy = partition_layer(block, 128, 128, 2 * whole, RUNTIME)
    assert list(partition_layer(block, 128, 128, 2 * whole, RUNTIME, whole_only=True)) == roomy
    assert roomy == [(0, block.num_dst)]
    tight = whole // 4
    assert len(partition_layer(block, 128, 128, tight, RUNTIME)) > 1
    assert partition_layer(block, 128, 128, tight, RUNTIME, whole_only=True) is None
