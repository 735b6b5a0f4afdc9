"""All-or-nothing and durability of commits and compactions with injected store failures.

A backend wrapper fails the ``N``-th write (``pipe_file``, ``put_if_absent``)
of a commit or of a compaction, either before the write reaches the store
(a refused call) or after it (the store applied it, the caller saw an error:
a timeout on the answer). For every ``N``:

- nothing is half visible: a fresh reader sees either the whole batch
  (the record was created: the commit reads it back and succeeds) or none
  of it, every in-list, row and count equal to the reference;
- the previous version keeps serving: a reader holding it reads as before;
- a retry succeeds (the batch lands exactly once, a compaction publishes
  its base), and the store verifies.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from gnn_faas.storage import versions as versions_mod
from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.compaction import compact
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import GraphHandle, open_graph
from gnn_faas.storage.resident import open_structure
from gnn_faas.storage.verify import verify_graph
from gnn_faas.storage.versions import GraphVersions, latest
from tests.storage.test_versions import Reference, check_equal, make_graph, random_batch

WRITES = ("pipe_file", "put_if_absent")


class Injected(Exception):
    """The failure the wrapper raises."""


class FailingBackend:
    """A backend whose ``fail_at``-th write (counting from 1) raises, before or
    after it reaches the store; every other call goes through."""

    def __init__(self, inner, fail_at: int = 0, after: bool = False):
        self.inner, self.fail_at, self.after = inner, fail_at, after
        self.writes: list[str] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _write(self, op: str, path: str, data):
        self.writes.append(f"{op} {path}")
        hit = len(self.writes) == self.fail_at
        if not hit:
            return getattr(self.inner, op)(path, data)
        if self.after:
            getattr(self.inner, op)(path, data)
        # no frame of the traceback may keep a view of the data (a staged upload's mmap)
        del data
        raise Injected(f"{op} {path} " + ("applied, answer lost" if self.after else "refused"))

    def pipe_file(self, path, data):
        try:
            return self._write("pipe_file", path, data)
        except Injected:
            del data
            raise

    def put_if_absent(self, path, data):
        return self._write("put_if_absent", path, data)


def versions(backend) -> GraphVersions:
    def open_base(prefix: str):
        graph = GraphHandle(backend, "g", prefix=prefix)
        return graph, KHopFetcher(graph, structure=open_structure(graph, 1 << 30)).base_neighbours

    return GraphVersions(backend, "g", open_base, freshness_s=0)


def setup(uri: str, seed: int, commits: int):
    src, dst, feats = make_graph(uri, symmetrized=False, seed=seed)
    ref = Reference(src, dst, feats, False)
    gv = versions(open_backend(uri))
    rng = np.random.default_rng(seed)
    for _ in range(commits):
        b = random_batch(rng, ref)
        gv.commit(b)
        ref.apply(b)
    return ref, rng


def fresh_equals(uri: str, ref: Reference) -> None:
    check_equal(versions(open_backend(uri)), ref)


def verifies(uri: str) -> None:
    report = verify_graph(open_graph(open_backend(uri), "g", verify="none"))
    assert report["ok"], report


def count_writes(uri: str, action) -> int:
    probe = FailingBackend(open_backend(uri))
    action(probe)
    return len(probe.writes)


@pytest.mark.parametrize("hint", [False, True], ids=["no-hint", "hint"])
@pytest.mark.parametrize("after", [False, True], ids=["refused", "answer-lost"])
def test_a_commit_failing_at_any_write_is_all_or_nothing(tmp_path, monkeypatch, after, hint):
    # the commit makes version 3: it moves the hint when versions 3, 6, ... do
    monkeypatch.setattr(versions_mod, "HINT_EVERY", 3 if hint else 1000)
    batch_rng = np.random.default_rng(99)
    n_writes = None
    step = 1
    while n_writes is None or step <= n_writes:
        uri = f"file://{tmp_path / f'{step}'}"
        ref, rng = setup(uri, seed=step, commits=2)
        batch = random_batch(batch_rng, ref)
        if n_writes is None:  # the writes of one commit, counted on a twin store
            twin = f"file://{tmp_path / 'twin'}"
            setup(twin, seed=step, commits=2)
            n_writes = count_writes(twin, lambda b, batch=batch: versions(b).commit(batch))
            assert n_writes == 2 + hint  # segment, record (, hint)
        held = versions(open_backend(uri))  # a reader on the previous version
        ref_before = copy.deepcopy(ref)
        writer = versions(FailingBackend(open_backend(uri), fail_at=step, after=after))
        try:
            rec, _ = writer.commit(batch)
        except Injected:
            rec = None
        committed = latest(open_backend(uri), "g").version == 3
        # the record was created, or the failure came before it: then it is not there
        assert committed == (rec is not None)
        assert committed == (step > 2 or (step == 2 and after))
        if committed:
            ref.apply(batch)
        fresh_equals(uri, ref)
        check_equal(held, ref_before)  # a request holding version 2 reads it as it was
        if not committed:  # a retry lands the batch exactly once
            rec, _ = versions(open_backend(uri)).commit(batch)
            assert rec.version == 3
            ref.apply(batch)
            fresh_equals(uri, ref)
        step += 1


@pytest.mark.parametrize("after", [False, True], ids=["refused", "answer-lost"])
def test_a_compaction_failing_at_any_write_leaves_the_graph_serving(tmp_path, after):
    n_writes = count_writes(_twin(tmp_path), lambda b: compact(b, "g", grace_s=0.0))
    assert n_writes > 5  # the new base's blobs, its manifest, the record, hint, garbage list
    for step in range(1, n_writes + 1):
        uri = f"file://{tmp_path / f'{step}'}"
        ref, _ = setup(uri, seed=5, commits=4)
        backend = FailingBackend(open_backend(uri), fail_at=step, after=after)
        try:
            out = compact(backend, "g", grace_s=0.0)
        except Injected:
            out = None
        was = latest(open_backend(uri), "g").version
        assert was in (4, 5) and (out is None or was == 5)
        fresh_equals(uri, ref)  # the previous version, or the compacted one: the same graph
        verifies(uri)
        again = compact(open_backend(uri), "g", grace_s=0.0)  # a retry finishes the job
        head = latest(open_backend(uri), "g")
        assert again["compacted"] == (was == 4)
        assert head.version == 5 and head.base_version == 4 and head.num_segments == 0
        fresh_equals(uri, ref)
        verifies(uri)


def _twin(tmp_path) -> str:
    uri = f"file://{tmp_path / 'twin'}"
    setup(uri, seed=5, commits=4)
    return uri


def test_a_base_left_by_a_killed_compaction_is_collected_and_a_used_one_never(tmp_path):
    uri = f"file://{tmp_path / 's'}"
    ref, rng = setup(uri, seed=6, commits=3)
    store = open_backend(uri)
    refused = FailingBackend(store, fail_at=12, after=False)  # the record's create
    with pytest.raises(Injected, match="put_if_absent"):
        compact(refused, "g", grace_s=10.0, now=lambda: 1000.0)
    assert store.exists("g/base-000000000003/manifest.json")  # written, never published
    batch = random_batch(rng, ref)
    versions(store).commit(batch)
    ref.apply(batch)
    out = compact(store, "g", grace_s=10.0, now=lambda: 1000.0)
    assert out["base"] == "g/base-000000000004"
    later = compact(store, "g", grace_s=10.0, now=lambda: 2000.0)  # nothing to fold: collects
    assert later["deleted"] > 0 and not store.exists("g/base-000000000003/manifest.json")
    fresh_equals(uri, ref)
    verifies(uri)
    # a key of the base in use is never deleted, even when a list names it
    from gnn_faas.storage.compaction import collect_garbage, schedule_garbage

    schedule_garbage(store, "g", ["g/base-000000000004/indices.bin"], after=0.0)
    collect_garbage(store, "g", now=3000.0)
    assert store.exists("g/base-000000000004/indices.bin")
    fresh_equals(uri, ref)
