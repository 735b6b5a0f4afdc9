"""The vectorised open-addressing id table against a dict, over random workloads."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.functions.id_table import IdTable


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_a_dict_under_puts_adds_deletes_and_scaling(dtype, seed):
    rng = np.random.default_rng(seed)
    table, ref = IdTable(dtype), {}
    universe = 10**12  # ids far beyond any dense array: the table never sees the range
    pool = rng.integers(0, universe, 3000)
    for step in range(60):
        keys = np.unique(rng.choice(pool, int(rng.integers(1, 200))))
        op = step % 4
        if op == 0:
            vals = rng.integers(0, 1000, keys.size).astype(dtype)
            table.put(keys, vals)
            ref.update(zip(keys.tolist(), vals.tolist()))
        elif op == 1:
            table.add(keys, 1)
            for k in keys.tolist():
                ref[k] = ref.get(k, 0) + 1
        elif op == 2:
            table.delete(keys[: keys.size // 2])
            for k in keys[: keys.size // 2].tolist():
                ref.pop(k, None)
        else:
            table.scale(0.5, floor=4.0)
            ref = {k: dtype(v) * dtype(0.5) for k, v in ref.items()}
            ref = {k: v for k, v in ref.items() if v >= 4.0}
        probe = np.concatenate((keys, rng.integers(0, universe, 50)))
        want = np.array([ref.get(k, -7) for k in probe.tolist()], dtype=dtype)
        np.testing.assert_array_equal(table.get(probe, default=-7), want)
        assert len(table) == len(ref)
        assert table.capacity >= 2 * len(table)
    keys, vals = table.items()
    assert dict(zip(keys.tolist(), vals.tolist())) == pytest.approx(ref)


def test_size_follows_the_entries_not_the_ids():
    table = IdTable(np.int32)
    ids = np.arange(10**15, 10**15 + 5000 * 7919, 7919)
    table.put(ids, np.arange(ids.size))
    assert table.capacity <= 4 * ids.size
    table.delete(ids[:4900])
    table.scale(1.0)  # mostly tombstones: shrinks back
    assert len(table) == 100 and table.capacity <= 1024
    np.testing.assert_array_equal(table.get(ids[4900:], -1), np.arange(4900, 5000))
