"""Exact reductions in bounded memory: the same bits as numpy on the whole array."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.traces import reduce as rd


def spill_of(x: np.ndarray, tmp_path, limit: int, parts: int = 7) -> rd.Spill:
    s = rd.Spill(str(tmp_path), limit=limit)
    for chunk in np.array_split(x, parts):
        s.append(chunk)
    return s


def values(rng, n: int) -> np.ndarray:
    """Latency-like values over six decades, with many exact ties."""
    x = rng.random(n) * rng.choice([1e-3, 1.0, 1e3], n)
    x[rng.random(n) < 0.3] = 0.0215  # one repeated service time
    return x


def test_numpy_sums_whole_arrays_pairwise():
    """The premise of :func:`pairwise_sum`: numpy's sum of a long contiguous
    array is the sum of its two halves split as the pairwise tree splits them."""
    x = values(np.random.default_rng(0), 3_000_017)
    n2 = x.size // 2 - (x.size // 2) % 8
    assert np.add.reduce(x) == np.add.reduce(x[:n2]) + np.add.reduce(x[n2:])


@pytest.mark.parametrize("n", [0, 1, 7, 129, 5_000, 2_500_003])
def test_pairwise_sum_equals_numpy_on_disk(n, tmp_path, monkeypatch):
    monkeypatch.setattr(rd, "LEAF", 1024)  # deep trees of file reads
    rng = np.random.default_rng(n)
    x, y = values(rng, n), values(rng, n // 3)
    s, t = spill_of(x, tmp_path, limit=100), spill_of(y, tmp_path, limit=100)
    assert n < 100 or not s.in_memory
    assert rd.pairwise_sum([(s, None)]) == np.add.reduce(x)
    # a mapped concatenation, as the billed durations of two functions are summed
    whole = np.concatenate([np.ceil(x / 1e-3) * 0.25, y * 0.5])
    got = rd.pairwise_sum([(s, lambda v: np.ceil(v / 1e-3) * 0.25), (t, lambda v: v * 0.5)])
    assert got == np.add.reduce(whole)
    assert rd.mean(s) == (x.mean() if n else 0.0)


@pytest.mark.parametrize("n", [1, 2, 100, 10_001, 300_007])
def test_percentiles_equal_numpy_on_disk(n, tmp_path):
    rng = np.random.default_rng(n)
    x = values(rng, n)
    x[: n // 10] *= -1  # negative values sort before positive ones
    s = spill_of(x, tmp_path, limit=50)
    assert n < 50 or not s.in_memory
    for q in ([50, 99], 99, [0, 25, 50, 99.9, 100]):
        got, want = rd.percentiles(s, q), np.percentile(x, q)
        assert np.shape(got) == np.shape(want)
        assert np.array_equal(got, want)


def test_select_finds_order_statistics(tmp_path):
    x = np.random.default_rng(3).permutation(np.repeat(np.arange(-5.0, 5.0, 0.5), 3))
    s = spill_of(x, tmp_path, limit=4)
    ranks = [0, 1, 17, 29, x.size - 1]
    assert rd.select(s, ranks) == np.sort(x)[ranks].tolist()


def test_spill_moves_to_disk_and_cleans_up(tmp_path):
    s = rd.Spill(str(tmp_path), limit=10)
    s.append(np.arange(6.0))
    assert s.in_memory and len(s) == 6
    s.append(np.arange(6.0, 12.0))
    assert not s.in_memory and len(list(tmp_path.iterdir())) == 1
    s.append(np.arange(12.0, 15.0))
    assert np.array_equal(np.concatenate(list(s.blocks(4))), np.arange(15.0))
    with pytest.raises(ValueError):
        s.whole()
    s.close()
    assert list(tmp_path.iterdir()) == []
