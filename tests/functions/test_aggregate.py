"""Aggregate ops against dense numpy references on small random blocks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.aggregate import (
    AGGREGATE_OPS,
    aggregate,
    combine_partials,
    partial_aggregate,
    slice_rows,
)
from gnn_faas.storage.computation_graph import Block


def make_block(rng: np.random.Generator, num_dst: int, num_src: int, max_deg: int = 5) -> Block:
    """Random CSR block; rows may be empty, edges may repeat and include self loops."""
    counts = rng.integers(0, max_deg + 1, size=num_dst)
    indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    indices = rng.integers(0, num_src, size=int(indptr[-1])).astype(np.int64)
    return Block(num_dst, num_src, indptr, indices)


def dense(block: Block) -> np.ndarray:
    """``A[i, j]`` = number of edges ``j -> i``."""
    a = np.zeros((block.num_dst, block.num_src))
    np.add.at(a, (np.repeat(np.arange(block.num_dst), np.diff(block.indptr)), block.indices), 1)
    return a


def with_one_self_loop(a: np.ndarray, off: int = 0) -> np.ndarray:
    a = a.copy()
    r = np.arange(a.shape[0])
    a[r, r + off] = 1.0  # PyG: existing self loops replaced by exactly one
    return a


def reference(op, block, h, *, eps=0.0, deg=None, a_src=None, a_dst=None, slope=0.2, off=0):
    """Dense float64 reference of every op (formulas of the module docstring)."""
    a = dense(block)
    h64 = h.astype(np.float64)
    n = block.num_dst
    cnt = a.sum(1)
    if op == "sum":
        return np.einsum("ij,j...->i...", a, h64)
    if op == "mean":
        s = np.einsum("ij,j...->i...", a, h64)
        return s / np.maximum(cnt, 1).reshape((-1,) + (1,) * (h.ndim - 1))
    if op == "max":
        masked = np.where((a > 0)[:, :, None], h64[None], -np.inf)
        out = masked.max(1) if block.num_src else np.zeros((n,) + h.shape[1:])
        out[cnt == 0] = 0.0
        return out
    if op == "gin":
        return np.einsum("ij,j...->i...", a, h64) + (1 + eps) * h64[off : off + n]
    if op == "gcn":
        a1 = with_one_self_loop(a, off)
        d = deg.astype(np.float64) + 1
        w = a1 / np.sqrt(d[off : off + n])[:, None] / np.sqrt(d)[None, :]
        return np.einsum("ij,j...->i...", w, h64)
    # gat: softmax over the multiset of edges plus one self loop, per head
    a1 = with_one_self_loop(a, off)
    logit = a_src[None, :, :] + a_dst[:, None, :]  # [n, num_src, H]
    logit = np.where(logit > 0, logit, slope * logit)
    m = np.where(a1[:, :, None] > 0, logit, -np.inf).max(1, keepdims=True)
    e = a1[:, :, None] * np.exp(logit - m)
    att = e / e.sum(1, keepdims=True)
    return np.einsum("ijh,jhc->ihc", att, h64)


def inputs(rng, op, block, dim=4, heads=2):
    if op == "gat":
        h = rng.standard_normal((block.num_src, heads, dim)).astype(np.float32)
        kw = dict(
            alpha_src=rng.standard_normal((block.num_src, heads)).astype(np.float32),
            alpha_dst=rng.standard_normal((block.num_src, heads)).astype(np.float32),
        )
    else:
        h = rng.standard_normal((block.num_src, dim)).astype(np.float32)
        kw = {}
    if op == "gcn":
        kw["deg_src"] = rng.integers(0, 9, size=block.num_src)
    if op == "gin":
        kw["eps"] = 0.25
    return h, kw


def ref_kwargs(kw, off, n):
    out = {"eps": kw.get("eps", 0.0), "deg": kw.get("deg_src"), "off": off}
    if "alpha_src" in kw:
        out["a_src"] = kw["alpha_src"].astype(np.float64)
        out["a_dst"] = kw["alpha_dst"][off : off + n].astype(np.float64)
    return out


@pytest.mark.parametrize("op", AGGREGATE_OPS)
@given(
    num_dst=st.integers(0, 9),
    extra_src=st.integers(0, 8),
    max_deg=st.integers(0, 6),
    seed=st.integers(0, 2**31),
)
@settings(max_examples=40, deadline=None)
def test_op_matches_dense_reference(op, num_dst, extra_src, max_deg, seed):
    rng = np.random.default_rng(seed)
    num_src = num_dst + extra_src
    if num_src == 0:
        return
    block = make_block(rng, num_dst, num_src, max_deg)
    h, kw = inputs(rng, op, block)
    out = aggregate(op, block, h, **kw)
    assert out.dtype == np.float32
    assert out.shape == (num_dst,) + h.shape[1:]
    np.testing.assert_allclose(
        out, reference(op, block, h, **ref_kwargs(kw, 0, num_dst)), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("op", AGGREGATE_OPS)
def test_empty_rows_and_empty_blocks(op):
    rng = np.random.default_rng(1)
    # Rows 0 and 2 have no in-edges; row 1 has two.
    block = Block(3, 5, np.array([0, 0, 2, 2]), np.array([3, 4]))
    h, kw = inputs(rng, op, block)
    out = aggregate(op, block, h, **kw)
    np.testing.assert_allclose(
        out, reference(op, block, h, **ref_kwargs(kw, 0, 3)), rtol=1e-5, atol=1e-6
    )
    if op in ("sum", "mean", "max"):
        assert not out[[0, 2]].any()  # PyG scatter semantics: empty -> 0
    # a block with no destination rows at all
    empty = Block(0, 5, np.array([0]), np.array([], dtype=np.int64))
    assert aggregate(op, empty, h, **kw).shape == (0,) + h.shape[1:]


@pytest.mark.parametrize("op", AGGREGATE_OPS)
def test_slices_and_partials_equal_whole(op):
    rng = np.random.default_rng(7)
    block = make_block(rng, 12, 20, max_deg=6)
    h, kw = inputs(rng, op, block)
    whole = aggregate(op, block, h, **kw)
    for a, b in ((0, 5), (5, 9), (9, 12), (3, 3)):
        part = slice_rows(block, a, b)
        assert part.dst_offset == a and part.num_src == block.num_src
        np.testing.assert_allclose(aggregate(op, part, h, **kw), whole[a:b], rtol=1e-5, atol=1e-6)
        # an explicit dst_offset equal to the slice's own is accepted
        np.testing.assert_allclose(
            aggregate(op, part, h, dst_offset=a, **kw), whole[a:b], rtol=1e-5, atol=1e-6
        )
        if op == "gat":  # alpha_dst of the unsliced block's dst rows serves every slice
            np.testing.assert_allclose(
                aggregate(op, part, h, **(kw | {"alpha_dst": kw["alpha_dst"][: block.num_dst]})),
                whole[a:b],
                rtol=1e-5,
                atol=1e-6,
            )
        # sources split in two: columns < 10 and >= 10, self term in the first part only
        rows = np.repeat(np.arange(part.num_dst), np.diff(part.indptr))
        states = []
        for k, keep in enumerate((part.indices < 10, part.indices >= 10)):
            counts = np.bincount(rows[keep], minlength=part.num_dst)
            sub = type(part)(
                part.num_dst,
                part.num_src,
                np.concatenate(([0], np.cumsum(counts))),
                part.indices[keep],
                dst_offset=a,
            )
            states.append(partial_aggregate(op, sub, h, include_self=k == 0, **kw))
        np.testing.assert_allclose(combine_partials(op, states), whole[a:b], rtol=1e-5, atol=1e-6)
    # slicing a slice accumulates the offset
    inner = slice_rows(slice_rows(block, 2, 10), 3, 6)
    assert inner.dst_offset == 5
    np.testing.assert_allclose(aggregate(op, inner, h, **kw), whole[5:8], rtol=1e-5, atol=1e-6)


def test_dst_offset_on_a_plain_block():
    """A caller may cut rows itself and pass dst_offset explicitly."""
    rng = np.random.default_rng(3)
    block = make_block(rng, 8, 12)
    h, kw = inputs(rng, "gcn", block)
    whole = aggregate("gcn", block, h, **kw)
    s = slice_rows(block, 4, 8)
    plain = Block(s.num_dst, s.num_src, s.indptr, s.indices)
    np.testing.assert_allclose(
        aggregate("gcn", plain, h, dst_offset=4, **kw), whole[4:], rtol=1e-5, atol=1e-6
    )
    # deg_dst given per destination row gives the same
    np.testing.assert_allclose(
        aggregate("gcn", plain, h, dst_offset=4, deg_dst=kw["deg_src"][4:8], **kw),
        whole[4:],
        rtol=1e-5,
        atol=1e-6,
    )


def test_bad_inputs_raise_invalid_request():
    rng = np.random.default_rng(0)
    block = make_block(rng, 4, 6)
    h = rng.standard_normal((6, 3)).astype(np.float32)
    gat_h = rng.standard_normal((6, 2, 3)).astype(np.float32)
    alpha = np.zeros((6, 2), np.float32)
    bad = [
        (lambda: aggregate("median", block, h), "unknown aggregate op"),
        (lambda: aggregate("sum", block, h.astype(np.int64)), "floating point"),
        (lambda: aggregate("sum", block, h[:5]), "5 rows"),
        (lambda: aggregate("sum", block, [[1.0]]), "numpy array"),
        (lambda: aggregate("sum", block, h[:, 0]), "shape"),
        (lambda: aggregate("gcn", block, h), "deg_src"),
        (lambda: aggregate("gcn", block, h, deg_src=np.ones(5)), "deg_src must have shape"),
        (lambda: aggregate("gcn", block, h, deg_src=-np.ones(6)), ">= 0"),
        (lambda: aggregate("gat", block, h), "[num_src, heads, C]"),
        (lambda: aggregate("gat", block, gat_h), "alpha_src and alpha_dst"),
        (
            lambda: aggregate("gat", block, gat_h, alpha_src=alpha[:, :1], alpha_dst=alpha),
            "alpha_src must have shape",
        ),
        (
            lambda: aggregate("gat", block, gat_h, alpha_src=alpha, alpha_dst=alpha[:3]),
            "alpha_dst must have shape",
        ),
        (
            lambda: aggregate("sum", Block(4, 6, block.indptr, block.indices + 6), h),
            "indices must lie",
        ),
        (lambda: aggregate("sum", Block(4, 6, block.indptr[:-1], block.indices), h), "num_dst + 1"),
        (
            lambda: aggregate("sum", Block(4, 6, block.indptr[::-1].copy(), block.indices), h),
            "indptr must start at 0",
        ),
        (lambda: aggregate("sum", block, h, dst_offset=3), "not source rows"),
        (lambda: aggregate("sum", slice_rows(block, 1, 3), h, dst_offset=2), "contradicts"),
        (lambda: slice_rows(block, 3, 5), "outside"),
        (lambda: combine_partials("sum", []), "at least one"),
        (lambda: combine_partials("max", [{"sum": h}]), "lacks"),
        (
            lambda: combine_partials("sum", [{"sum": h, "count": 1}, {"sum": h[:2], "count": 1}]),
            "different shapes",
        ),
    ]
    for call, message in bad:
        with pytest.raises(InvalidRequest, match=None) as info:
            call()
        assert message in str(info.value), (message, str(info.value))


def test_max_over_many_chunks():
    """Blocks whose gathered rows exceed one chunk (about 1 MiB) give the same max."""
    rng = np.random.default_rng(5)
    block = make_block(rng, 3000, 4000, max_deg=30)
    h = rng.standard_normal((4000, 300)).astype(np.float32)
    expect = np.full((3000, 300), -np.inf, np.float32)
    rows = np.repeat(np.arange(3000), np.diff(block.indptr))
    np.maximum.at(expect, rows, h[block.indices])
    expect[np.diff(block.indptr) == 0] = 0.0
    np.testing.assert_array_equal(aggregate("max", block, h), expect)
