"""Synthetic graphs shaped like the seeds' benchmark datasets (``datasets synth``).

A degree-corrected planted-partition Chung-Lu graph with the vertex count, edge
count, average and maximum degree and feature dimension of the dataset it is
"like" (higgs-twitter, stackoverflow, reddit, products), at ``scale`` F (the
average degree kept):

- expected degrees ``w_r = d_max (r + 1)^(-alpha)`` over seeded random degree
  ranks (``alpha`` fitted so the mean is ``m / n``; ``d_max <= (n - 1) / 4``);
  in-degrees one multinomial draw of ``m`` (the edge count is exact); each
  in-edge's source from the target's community with probability ``homophily``
  (0.8), else from all vertices, by weight; no duplicates, no self loops;
- labels are the planted communities; features ``N(0, I)`` plus a weak class
  signal, so a GNN learns from the neighbours what one vertex barely shows;
  ``split.bin`` a seeded 60/20/20 train/val/test split;
- ``request_order.bin``: ``clip(2 n, 10^4, 10^6)`` targets, Zipf over degree rank
  (``s = 1``), 30% repeating one of the previous 64 requests.

Edges and features are written a block at a time straight into the store (peak
memory a few arrays of ``n`` entries, not the graph); blobs are staged and the
manifest published last, so an interrupted run leaves nothing. The output
depends only on the like-dataset, scale and seed. The generator's reasons and
parameters: docs/design/synthetic-graphs.md.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.backends import StorageBackend, open_backend
from gnn_faas.storage.format import Manifest
from gnn_faas.storage.staged_writer import StagedGraphWriter

EDGE_BLOCK = 1 << 20  # edges generated per block (rows are never split)
FEATURE_BLOCK_BYTES = 16 << 20  # bytes of features generated per block
WEIGHTED_ROUNDS = 3  # redraw rounds by weight before uniform redraws


@dataclass(frozen=True)
class LikeSpec:
    """The shape of a real dataset that a synthetic graph imitates."""

    name: str
    num_nodes: int
    num_edges: int
    feature_dim: int
    max_degree: int  # largest expected degree (the power law's head)
    num_classes: int
    source: str

    @property
    def avg_degree(self) -> float:
        return self.num_edges / self.num_nodes


# Vertex/edge counts and feature dimensions are the ones the seeds evaluate on
# (FaaS-GNN: higgs-twitter, stackoverflow with random 300/512-dim features;
# OMEGA: Reddit, ogbn-products). max_degree sets the head of the power law: of
# the order of each graph's published largest degree. num_classes: Reddit 41
# and products 47 as the real ones; 8 for the two unlabelled graphs.
LIKES: dict[str, LikeSpec] = {
    s.name: s
    for s in (
        LikeSpec("higgs-twitter", 456_626, 14_855_842, 300, 51_386, 8, "SNAP higgs-twitter"),
        LikeSpec("stackoverflow", 2_601_977, 63_497_050, 512, 44_065, 8, "SNAP sx-stackoverflow"),
        LikeSpec("reddit", 232_965, 114_615_892, 602, 21_657, 41, "Reddit (GraphSAGE)"),
        LikeSpec("products", 2_449_029, 123_718_280, 100, 17_481, 47, "ogbn-products"),
    )
}


@dataclass(frozen=True)
class SynthParams:
    """Generator parameters (documented in the module docstring)."""

    homophily: float = 0.8
    feature_signal: float = 1.0
    zipf_s: float = 1.0
    repeat_prob: float = 0.3
    repeat_window: int = 64
    split: tuple[float, float] = (0.6, 0.8)  # cumulative train, val fractions


@dataclass(frozen=True)
class SynthShape:
    """The scaled target: counts, the fitted power law and its parameters."""

    like: str
    scale: float
    num_nodes: int
    num_edges: int
    feature_dim: int
    num_classes: int
    max_degree: float
    alpha: float
    params: SynthParams = field(default_factory=SynthParams)

    def expected_degrees(self) -> np.ndarray:
        """``w_r`` by degree rank, normalised to sum to ``num_edges`` (float64)."""
        w = powerlaw_weights(self.num_nodes, self.max_degree, self.alpha)
        return w * (self.num_edges / w.sum())


def powerlaw_weights(n: int, d_max: float, alpha: float) -> np.ndarray:
    return d_max * np.arange(1, n + 1, dtype=np.float64) ** (-alpha)


def fit_alpha(n: int, d_avg: float, d_max: float) -> float:
    """``alpha`` with ``mean(d_max (r+1)^-alpha) = d_avg`` (bisection; mean falls with alpha)."""
    if not 0 < d_avg < d_max:
        raise InvalidRequest(f"cannot fit a power law with mean {d_avg:g} and maximum {d_max:g}")
    lo, hi = 0.0, 8.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if powerlaw_weights(n, d_max, mid).mean() > d_avg:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def plan_shape(like: str, scale: float = 1.0, params: SynthParams | None = None) -> SynthShape:
    """Counts and power law of ``like`` scaled by ``scale`` (average degree kept)."""
    try:
        spec = LIKES[like]
    except KeyError:
        raise InvalidRequest(f"unknown --like {like!r}; choose one of {', '.join(LIKES)}") from None
    if not 0 < scale <= 1:
        raise InvalidRequest(f"--scale must lie in (0, 1], got {scale}")
    n = int(round(spec.num_nodes * scale))
    m = int(round(spec.num_edges * scale))
    cap = (n - 1) / 4
    if n < 16 or m / n >= cap:
        raise InvalidRequest(
            f"--scale {scale} leaves {n} vertices: too few for average degree {m / max(n, 1):.0f} "
            "(it must stay below (n-1)/4); use a larger scale"
        )
    alpha_full = fit_alpha(spec.num_nodes, spec.avg_degree, spec.max_degree)
    d_max = min(spec.max_degree * scale**alpha_full, cap)
    d_max = max(d_max, min(2.0 * m / n, cap))
    alpha = fit_alpha(n, m / n, d_max) if d_max > m / n else 0.0
    return SynthShape(
        like=like,
        scale=float(scale),
        num_nodes=n,
        num_edges=m,
        feature_dim=spec.feature_dim,
        num_classes=spec.num_classes,
        max_degree=float(d_max),
        alpha=alpha,
        params=params or SynthParams(),
    )


# -- structure ---------------------------------------------------------------
@dataclass(frozen=True)
class Structure:
    """Per-vertex arrays the edge blocks draw from (all ``n`` long)."""

    weight: np.ndarray  # expected degree of each vertex (float64)
    rank: np.ndarray  # degree rank of each vertex
    community: np.ndarray  # planted class of each vertex (int64)
    in_degree: np.ndarray  # exact in-degree of each vertex (int64)
    by_comm: np.ndarray  # vertices sorted by community
    cum_weight: np.ndarray  # cumsum of weight over by_comm
    comm_lo: np.ndarray  # cum_weight offset where each community starts (K + 1)


def build_structure(shape: SynthShape, seed: int) -> Structure:
    rng = np.random.default_rng([seed, 1])
    n, k = shape.num_nodes, shape.num_classes
    by_rank = shape.expected_degrees()
    perm = rng.permutation(n)  # perm[r]: vertex of degree rank r
    weight = np.empty(n, np.float64)
    weight[perm] = by_rank
    rank = np.empty(n, np.int64)
    rank[perm] = np.arange(n)
    community = rng.integers(0, k, n).astype(np.int64)
    in_degree = rng.multinomial(shape.num_edges, weight / weight.sum()).astype(np.int64)
    over = in_degree - (n - 1)
    while (over > 0).any():  # never in practice (d_max <= (n-1)/4); keeps counts exact
        excess = int(over[over > 0].sum())
        in_degree = np.minimum(in_degree, n - 1)
        in_degree += rng.multinomial(excess, np.full(n, 1.0 / n))
        over = in_degree - (n - 1)
    by_comm = np.argsort(community, kind="stable")
    cum_weight = np.cumsum(weight[by_comm])
    starts = np.searchsorted(community[by_comm], np.arange(k + 1))
    comm_lo = np.concatenate(([0.0], cum_weight))[starts]
    return Structure(weight, rank, community, in_degree, by_comm, cum_weight, comm_lo)


def _draw_sources(
    st: Structure, rows: np.ndarray, rng: np.random.Generator, homophily: float, uniform: bool
) -> np.ndarray:
    """One source per entry of ``rows``: from the row's community with probability
    ``homophily`` (by weight), else from everyone (by weight, or uniformly)."""
    n = st.weight.size
    if uniform:
        return rng.integers(0, n, rows.size)
    comm = st.community[rows]
    inside = rng.random(rows.size) < homophily
    lo = np.where(inside, st.comm_lo[comm], 0.0)
    hi = np.where(inside, st.comm_lo[comm + 1], st.cum_weight[-1])
    u = lo + rng.random(rows.size) * (hi - lo)
    pos = np.minimum(np.searchsorted(st.cum_weight, u, side="right"), n - 1)
    return st.by_comm[pos]


def edge_block(
    st: Structure, r0: int, r1: int, seed: int, block: int, homophily: float
) -> np.ndarray:
    """Sources (CSR ``indices``) of rows ``r0..r1-1``: sorted within each row,
    distinct, no self loops, exactly ``in_degree[r]`` per row.

    Round 0 draws every in-edge (``homophily`` inside the community); later
    rounds redraw only what duplicates and self loops lost, from everyone (by
    weight, then uniformly), and check the few new keys against the sorted
    ones by binary search instead of re-sorting the block.
    """
    n = st.weight.size
    rng = np.random.default_rng([seed, 2, block])
    need = st.in_degree[r0:r1]
    rows = np.repeat(np.arange(r0, r1, dtype=np.int64), need)
    src = _draw_sources(st, rows, rng, homophily, uniform=False)
    ok = src != rows
    base = np.unique((rows[ok] - r0) * n + src[ok])
    extra = np.empty(0, np.int64)
    have = np.bincount(base // n, minlength=r1 - r0)
    rnd = 1
    while (have < need).any():
        rows = np.repeat(np.arange(r0, r1, dtype=np.int64), need - have)
        src = _draw_sources(st, rows, rng, 0.0, uniform=rnd >= WEIGHTED_ROUNDS)
        ok = src != rows
        new = np.unique((rows[ok] - r0) * n + src[ok])
        for known in (base, extra):
            pos = np.minimum(np.searchsorted(known, new), max(known.size - 1, 0))
            if known.size:
                new = new[known[pos] != new]
        extra = np.sort(np.concatenate((extra, new)))
        have += np.bincount(new // n, minlength=r1 - r0)
        rnd += 1
    keys = np.sort(np.concatenate((base, extra)), kind="stable") if extra.size else base
    return keys % n


def _row_blocks(in_degree: np.ndarray) -> np.ndarray:
    """Row cut points so each block holds about ``EDGE_BLOCK`` edges (rows whole)."""
    indptr = np.concatenate(([0], np.cumsum(in_degree)))
    targets = np.arange(EDGE_BLOCK, indptr[-1], EDGE_BLOCK)
    cuts = np.searchsorted(indptr, targets, side="left")
    return np.unique(np.concatenate(([0], cuts, [in_degree.size])))


# -- features, labels, requests ------------------------------------------------
def feature_block(
    shape: SynthShape, community: np.ndarray, centroids: np.ndarray, r0: int, r1: int, seed: int
) -> np.ndarray:
    rows = r1 - r0
    rng = np.random.default_rng([seed, 3, r0])
    x = rng.standard_normal((rows, shape.feature_dim), dtype=np.float32)
    x += centroids[community[r0:r1]]
    return x


def class_centroids(shape: SynthShape, seed: int) -> np.ndarray:
    """``(sigma / sqrt(dim)) c_k`` for each class ``k`` (float32 ``[K, dim]``)."""
    rng = np.random.default_rng([seed, 4])
    c = rng.standard_normal((shape.num_classes, shape.feature_dim))
    return (c * (shape.params.feature_signal / np.sqrt(shape.feature_dim))).astype(np.float32)


def split_blob(n: int, seed: int, cuts: tuple[float, float]) -> np.ndarray:
    """uint8 per vertex: 0 train, 1 validation, 2 test (seeded uniform draw)."""
    u = np.random.default_rng([seed, 5]).random(n)
    return (u >= cuts[0]).astype(np.uint8) + (u >= cuts[1]).astype(np.uint8)


def request_order(st: Structure, shape: SynthShape, seed: int) -> np.ndarray:
    """Targets in time order: Zipf over degree rank plus repeats of recent requests."""
    p = shape.params
    n = shape.num_nodes
    k = int(np.clip(2 * n, 10_000, 1_000_000))
    rng = np.random.default_rng([seed, 6])
    cdf = np.cumsum(np.arange(1, n + 1, dtype=np.float64) ** (-p.zipf_s))
    ranks = np.minimum(np.searchsorted(cdf, rng.random(k) * cdf[-1], side="right"), n - 1)
    by_rank = np.empty(n, np.int64)
    by_rank[st.rank] = np.arange(n)
    fresh = by_rank[ranks]
    ptr = np.arange(k, dtype=np.int64)
    back = ptr - rng.integers(1, p.repeat_window + 1, k)
    repeat = (rng.random(k) < p.repeat_prob) & (back >= 0)
    ptr[repeat] = back[repeat]
    while True:  # pointer jumping: a repeat of a repeat is the original request
        nxt = ptr[ptr]
        if np.array_equal(nxt, ptr):
            break
        ptr = nxt
    return fresh[ptr]


# -- the whole graph -----------------------------------------------------------
@dataclass(frozen=True)
class SynthResult:
    manifest: Manifest
    wall_s: float
    peak_rss_mib: float
    bytes: int

    def summary(self) -> dict:
        m = self.manifest
        return {
            "vertices": m.num_nodes,
            "edges": m.num_edges,
            "feature_dim": m.feature_dim,
            "wall_s": self.wall_s,
            "peak_rss_mib": self.peak_rss_mib,
            "bytes": self.bytes,
        }


def peak_rss_mib() -> float:
    """This process's peak resident set size (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def synthesize(
    store: StorageBackend | str,
    like: str,
    *,
    scale: float = 1.0,
    seed: int = 0,
    name: str | None = None,
    progress: bool = False,
    params: SynthParams | None = None,
) -> SynthResult:
    """Generate a ``like``-shaped graph and publish it to ``store`` as ``name``
    (default ``<like>-like``), replacing any graph of that name."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    shape = plan_shape(like, scale, params)
    name = name or f"{like}-like"
    backend = open_backend(store) if isinstance(store, str) else store
    n, m, dim = shape.num_nodes, shape.num_edges, shape.feature_dim
    st = build_structure(shape, seed)
    bar: Callable[..., tqdm] = lambda total, desc, unit: tqdm(  # noqa: E731
        total=total, desc=desc, unit=unit, unit_scale=True, disable=not progress, leave=False
    )
    with StagedGraphWriter(backend, name) as w:
        indptr = np.concatenate(([0], np.cumsum(st.in_degree)))
        w.write_array("indptr", indptr.astype("<i8"))
        out_degree = np.zeros(n, np.int64)
        stream = w.blob("indices", "<i4", (m,))
        cuts = _row_blocks(st.in_degree)
        with bar(m, f"{name} edges", "edge") as pb:
            for b, (r0, r1) in enumerate(zip(cuts[:-1], cuts[1:])):  # a loop over blocks
                idx = edge_block(st, int(r0), int(r1), seed, b, shape.params.homophily)
                out_degree += np.bincount(idx, minlength=n)
                stream.write(idx.astype("<i4"))
                pb.update(idx.size)
        w.finish(stream)
        w.write_array("degree", out_degree.astype("<i4"))
        centroids = class_centroids(shape, seed)
        rows_per = max(1, FEATURE_BLOCK_BYTES // (4 * dim))
        stream = w.blob("features", "<f4", (n, dim))
        with bar(n, f"{name} features", "row") as pb:
            for r0 in range(0, n, rows_per):  # a loop over blocks of rows
                r1 = min(n, r0 + rows_per)
                stream.write(feature_block(shape, st.community, centroids, r0, r1, seed))
                pb.update(r1 - r0)
        w.finish(stream)
        w.write_array("labels", st.community.astype("<i8"))
        w.write_array("split", split_blob(n, seed, shape.params.split))
        w.write_array("request_order", request_order(st, shape, seed))
        p = shape.params
        manifest = w.publish(
            num_nodes=n,
            num_edges=m,
            feature_dim=dim,
            symmetrized=False,
            num_classes=shape.num_classes,
            extra={
                "dataset": f"synth:{like}",
                "like": like,
                "scale": shape.scale,
                "seed": seed,
                "generator": "planted-partition Chung-Lu",
                "powerlaw_alpha": shape.alpha,
                "max_expected_degree": shape.max_degree,
                "homophily": p.homophily,
                "features": f"random normal + class signal sigma={p.feature_signal}, seed {seed}",
                "label": "planted community",
                "split": "split.bin: 0 train, 1 val, 2 test (60/20/20)",
                "requests": f"zipf s={p.zipf_s} over degree rank, repeat p={p.repeat_prob} "
                f"of the last {p.repeat_window}",
                "self_loops": 0,
            },
        )
        total = w.bytes_written()
    return SynthResult(manifest, time.perf_counter() - t0, peak_rss_mib(), total)
