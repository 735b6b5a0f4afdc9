"""Versioned graphs: an immutable base, an append-only log of deltas, one pointer.

Layout under a graph's prefix ``NAME/`` (beside today's base blobs)::

    NAME/versions/000000000007.json   version 7's record (created once, never changed)
    NAME/versions/LATEST              a hint: a recent version (readers probe past it)
    NAME/log/000000000007-<id>.seg    the delta version 7 appended (storage/delta.py)
    NAME/base-000000000005/           a base written by compaction (storage/compaction.py)

A record names its base (a prefix: ``NAME`` itself, or a compacted base) and
the segments after it, in order: those after version ``segments_from`` listed
in it (at most :data:`SEGMENTS_PER_RECORD` when a commit writes it), the older
ones in record ``segments_from`` and so on back to the base
(:func:`segments_after`), so a record's size stays bounded however long the
log grows; version 0 is the graph as written. The
pointer is advanced only by creating the next record with the backends'
atomic create-if-absent (:meth:`StorageBackend.put_if_absent`: a link on the
file store, a conditional PUT on S3, ``SET NX`` on Redis), so of two writers
racing for version ``v + 1`` exactly one wins; the other re-reads, checks its
batch again on the new version, and tries ``v + 2``. A batch is all or nothing
and durable before it is acknowledged: its segment is written first, then the
record (the commit point). A writer killed before the record leaves an
unreferenced segment (removed by a later compaction), after it the version is
there.

:class:`GraphVersions` is one process's view of a graph: the current
:class:`~gnn_faas.storage.graph_state.GraphState` (each newer one built from
the previous by applying only the new segments), refreshed from the store at
most ``freshness_s`` after a version appears, and the commits it makes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from gnn_faas.errors import CorruptBlob, InvalidRequest, TransientStorageError, Unavailable
from gnn_faas.storage.backends.base import StorageBackend
from gnn_faas.storage.delta import Delta, UpdateBatch
from gnn_faas.storage.format import (
    VERSION_HINT,
    VERSIONS_DIR,
    GraphHandle,
    latest_version,
    read_version,
    validate_name,
    version_key,
)
from gnn_faas.storage.graph_state import GraphState

log = logging.getLogger("gnn_faas.storage")

LOG_DIR = "log"
COMMIT_ATTEMPTS = 50  # versions a writer may lose the race for before it gives up...
COMMIT_PATIENCE_S = 30.0  # ...unless it has been trying for less than this
BACKOFF_S = (0.001, 0.05)  # jittered wait after a lost race: first, most
FULL_CHECK_S = 5.0  # a poller reads the hint (a full refresh) at least this often
HINT_EVERY = 16  # a commit moves the hint at the versions divisible by this
FOLD_SEGMENTS = 512  # segments read and folded at once: memory bounded, few merges
SEGMENTS_PER_RECORD = 64  # segments one record lists; older ones: the record it points to


def segment_key(name: str, version: int) -> str:
    return f"{name}/{LOG_DIR}/{int(version):012d}-{uuid.uuid4().hex[:12]}.seg"


def base_prefix(name: str, version: int) -> str:
    return f"{name}/base-{int(version):012d}"


@dataclass(frozen=True)
class VersionRecord:
    """One version: its base, the segments after it, its counts and history.

    ``segments``: the segments after version ``segments_from`` (``-1``: after the
    base), in order; :func:`segments_after` walks back to older ones.
    ``log_bytes``/``log_segments``: the whole log after the base (``-1``: what
    ``segments`` lists, as records written before the chain hold it all)."""

    graph: str
    version: int
    base: str
    base_version: int
    segments: tuple[tuple[int, str, int], ...]  # (version, key, bytes)
    num_nodes: int
    num_edges: int
    created: float
    commit: str = ""
    last_compaction: dict | None = None
    segments_from: int = -1
    log_bytes: int = -1
    log_segments: int = -1

    def __post_init__(self) -> None:
        if self.segments_from < 0:
            object.__setattr__(self, "segments_from", self.base_version)
        if self.log_bytes < 0:
            object.__setattr__(self, "log_bytes", int(sum(s[2] for s in self.segments)))
        if self.log_segments < 0:
            object.__setattr__(self, "log_segments", len(self.segments))

    @property
    def delta_bytes(self) -> int:
        """Bytes of every segment after the base."""
        return self.log_bytes

    @property
    def num_segments(self) -> int:
        """Segments after the base."""
        return self.log_segments

    def to_json(self) -> bytes:
        d = {
            "graph": self.graph,
            "version": self.version,
            "base": self.base,
            "base_version": self.base_version,
            "segments": [list(s) for s in self.segments],
            "segments_from": self.segments_from,
            "log_bytes": self.log_bytes,
            "log_segments": self.log_segments,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "created": self.created,
            "commit": self.commit,
            "last_compaction": self.last_compaction,
        }
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_dict(cls, d: dict) -> VersionRecord:
        return cls(
            graph=d["graph"],
            version=int(d["version"]),
            base=d["base"],
            base_version=int(d["base_version"]),
            segments=tuple((int(v), str(k), int(b)) for v, k, b in d["segments"]),
            num_nodes=int(d["num_nodes"]),
            num_edges=int(d["num_edges"]),
            created=float(d["created"]),
            commit=str(d.get("commit", "")),
            last_compaction=d.get("last_compaction"),
            segments_from=int(d.get("segments_from", -1)),
            log_bytes=int(d.get("log_bytes", -1)),
            log_segments=int(d.get("log_segments", -1)),
        )

    @classmethod
    def of_base(cls, graph: GraphHandle) -> VersionRecord:
        """Version 0: the graph as written."""
        return cls(graph.name, 0, graph.prefix, 0, (), graph.num_nodes, graph.num_edges, 0.0)

    def followed_by(self, segment: tuple[int, str, int], **fields) -> VersionRecord:
        """The next version's record, appending ``segment`` to the log (a new
        list, pointing here, when this one lists :data:`SEGMENTS_PER_RECORD`)."""
        full = len(self.segments) >= SEGMENTS_PER_RECORD
        return replace(
            self,
            version=segment[0],
            segments=(segment,) if full else self.segments + (segment,),
            segments_from=self.version if full else self.segments_from,
            log_bytes=self.log_bytes + int(segment[2]),
            log_segments=self.log_segments + 1,
            **fields,
        )


def latest(
    backend: StorageBackend, name: str, base: GraphHandle | None = None, known: int = 0
) -> VersionRecord:
    """The newest version of graph ``name`` (version 0 when it was never updated);
    ``known``: a version the caller knows exists (the search starts there when
    the hint is older)."""
    rec = latest_version(backend, name, known)
    if rec is not None:
        return VersionRecord.from_dict(rec)
    if base is None:
        base = GraphHandle(backend, name, verify="none")
    return VersionRecord.of_base(base)


def record(backend: StorageBackend, name: str, version: int) -> VersionRecord | None:
    rec = read_version(backend, name, version)
    return None if rec is None else VersionRecord.from_dict(rec)


def publish(backend: StorageBackend, rec: VersionRecord, hint: bool | None = None) -> bool:
    """Create ``rec``'s record if its version is free (the commit point); then
    move the hint forward (best effort: readers search past a stale one) when
    ``hint``, by default at version 1 and every :data:`HINT_EVERY`-th: a hint written
    with every commit would cost each one a third durable write, while a reader
    finds the versions past it in a few reads (``format.latest_version``).

    A create that fails with an error (a timeout, a dropped connection) may have
    been applied all the same: the record is then read back, and it is this
    commit's when it holds ``rec.commit`` (each commit's id is unique)."""
    try:
        created = backend.put_if_absent(version_key(rec.graph, rec.version), rec.to_json())
    except Exception:
        held = record(backend, rec.graph, rec.version)  # raises when the store is down
        if held is None or held.commit != rec.commit:
            raise
        created = True
    if not created:
        return False
    if hint is None:  # version 1's too: a graph with versions has a hint (a reader
        # whose hinted record a compaction collected lists the records instead)
        hint = rec.version % HINT_EVERY == 0 or rec.version == 1
    if not hint:
        return True
    try:
        backend.pipe_file(f"{rec.graph}/{VERSIONS_DIR}/{VERSION_HINT}", str(rec.version).encode())
    except Exception as exc:  # noqa: BLE001 - the version is committed; the hint may lag
        log.warning(
            "graph %s: version %d committed, hint not moved: %s", rec.graph, rec.version, exc
        )
    return True


def read_delta(backend: StorageBackend, key: str) -> Delta:
    return Delta.decode(backend.cat_file(key), where=key)


def read_deltas(backend: StorageBackend, segments) -> list[Delta]:
    """The deltas of ``segments`` (``(version, key, bytes)``), read as one batch
    (``cat_ranges``: concurrent GETs on S3, one pipeline on Redis), in order."""
    segments = list(segments)
    if len(segments) <= 1:
        return [read_delta(backend, key) for _, key, _ in segments]
    keys = [key for _, key, _ in segments]
    blobs = backend.cat_ranges(keys, [0] * len(keys), [int(n) for _, _, n in segments])
    return [Delta.decode(bytes(b), where=k) for b, k in zip(blobs, keys)]


def fold(backend: StorageBackend, state: GraphState, segments) -> GraphState:
    """``state`` with ``segments`` applied, :data:`FOLD_SEGMENTS` read and merged
    at a time (:meth:`GraphState.apply_all`)."""
    segments = list(segments)
    for lo in range(0, len(segments), FOLD_SEGMENTS):  # a loop over groups of segments
        part = segments[lo : lo + FOLD_SEGMENTS]
        deltas = read_deltas(backend, part)
        state = state.apply_all([(d, v, k, n) for d, (v, k, n) in zip(deltas, part)])
    return state


def segments_after(
    backend: StorageBackend, rec: VersionRecord, after: int
) -> tuple[tuple[int, str, int], ...]:
    """``rec``'s log segments of the versions after ``after`` (and after its base),
    in order: its own list, then the records it points to as far back as needed."""
    after = max(int(after), rec.base_version)
    parts, cur = [], rec
    while True:
        parts.append(tuple(s for s in cur.segments if s[0] > after))
        if cur.segments_from <= after:
            break
        older = record(backend, rec.graph, cur.segments_from)
        if older is None:
            raise CorruptBlob(
                f"graph {rec.graph!r}: version {cur.segments_from}'s record, which version "
                f"{cur.version} continues, is missing"
            )
        cur = older
    return tuple(s for part in reversed(parts) for s in part)


class GraphVersions:
    """One process's view of a versioned graph (see the module docstring).

    ``open_base(prefix)`` returns ``(GraphHandle, base_lists)`` of a base: the
    caller decides how its structure is read (resident, chunk-cached).
    """

    def __init__(
        self,
        backend: StorageBackend,
        name: str,
        open_base: Callable[[str], tuple[GraphHandle, Callable]],
        freshness_s: float = 1.0,
    ):
        validate_name(name)
        self.backend = backend
        self.name = name
        self.freshness_s = float(freshness_s)
        self._open_base = open_base
        self._lock = threading.Lock()  # builds states one at a time
        self._commit_lock = threading.Lock()  # this process's writers queue here, then race others
        self._checked_at = 0.0
        self._full_at = 0.0
        self._offered: list[tuple[VersionRecord, Delta]] = []  # see offer()
        self._offer_lock = threading.Lock()
        self.applied_segments = 0
        rec = latest(backend, name)
        self.record = rec
        self.state = self._load(rec, None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading -----------------------------------------------------------------
    def current(self) -> GraphState:
        """The state a request runs on: the newest this process knows, checked
        against the store first when that was longer ago than ``freshness_s``
        (with ``freshness_s = 0``: on every call). With the background refresher
        running (:meth:`start`) a request never waits for the check. A store that
        does not answer the check is no reason to fail a request: it runs on the
        newest version known (no writer can commit to a store that is down)."""
        stale = time.monotonic() - self._checked_at > self.freshness_s
        if self.freshness_s <= 0 or (stale and self._thread is None):
            try:
                self.poll()
            except TransientStorageError as exc:
                log.debug("graph %s: version check failed, serving %d: %s",
                          self.name, self.state.version, exc)  # fmt: skip
        return self.state

    def refresh(self) -> GraphState:
        """Catch up with the store's newest version (reads the hint and probes past it)."""
        checked = time.monotonic()
        rec = latest(self.backend, self.name, known=self.state.version)
        if rec.version > self.state.version:
            self._advance(rec)
        self._checked_at = checked
        return self.state

    def poll(self) -> GraphState:
        """A refresh that costs one read while nothing is new: the record after the
        newest known version (absent: done); a full :meth:`refresh` when it exists,
        and at least every :data:`FULL_CHECK_S` (a reader left behind past a
        compaction's grace period finds its next record collected)."""
        if self._offered:
            self._take_offered()
        checked = time.monotonic()
        recent = checked - self._full_at < FULL_CHECK_S
        if recent and record(self.backend, self.name, self.state.version + 1) is None:
            self._checked_at = checked
            return self.state
        self._full_at = checked
        return self.refresh()

    def _advance(self, rec: VersionRecord) -> None:
        with self._lock:
            if rec.version <= self.state.version:
                return
            state = self._load(rec, self.state)
            self.state, self.record = state, rec

    def _load(self, rec: VersionRecord, prev: GraphState | None) -> GraphState:
        """The state of ``rec``: ``prev`` plus the segments after it when ``prev``
        is on the same base; else the base opened and every segment applied
        (in one merge: :meth:`GraphState.apply_all`)."""
        if prev is None or prev.graph.prefix != rec.base or prev.version < rec.base_version:
            graph, base_lists = self._open_base(rec.base)
            state = GraphState.of_base(graph, base_lists, version=rec.base_version)
        else:
            state = prev
        segments = segments_after(self.backend, rec, state.version)
        state = fold(self.backend, state, segments)
        self.applied_segments += len(segments)
        if state.version < rec.version:  # versions without a segment (a compaction's)
            state = replace(state, version=rec.version)
        return state

    def reload(self) -> GraphState:
        """Open the newest version's base again (its structure read and checked
        anew) and rebuild the state from it."""
        with self._lock:
            rec = latest(self.backend, self.name)
            self.state, self.record = self._load(rec, None), rec
        return self.state

    # -- writing -------------------------------------------------------------------
    def commit(self, batch: UpdateBatch) -> tuple[VersionRecord, Delta]:
        """Commit ``batch`` as the next version (checked against it; retried on the
        version after when another writer took it): ``(record, delta)``. The new
        state is this process's current one when it returns (read-your-writes).

        The first attempt builds on the newest version this process knows, without
        asking the store: the create-if-absent of the version after it fails when
        another writer was first, and only then is the store read."""
        with self._commit_lock:
            t0, attempt = time.monotonic(), 0
            while attempt < COMMIT_ATTEMPTS or time.monotonic() - t0 < COMMIT_PATIENCE_S:
                if attempt:  # optimistic first: the create below fails if a version came
                    # a jittered, growing wait: a writer that keeps losing to a faster
                    # one gets in when that one pauses (it never waits on a lock)
                    cap = min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** min(attempt, 16))
                    time.sleep(random.uniform(0, cap))
                    self.refresh()
                attempt += 1
                state, rec = self.state, self.record
                try:
                    delta = state.prepare(batch)
                except InvalidRequest:
                    if attempt > 1:  # checked against the store's newest version
                        raise
                    # the optimistic try checked the batch against the newest version
                    # this process knows; it may name vertices a newer one added
                    self.refresh()
                    state, rec = self.state, self.record
                    delta = state.prepare(batch)
                data = delta.encode()
                key = segment_key(self.name, rec.version + 1)
                self.backend.pipe_file(key, data)
                nxt = state.apply(delta, rec.version + 1, key, len(data))
                new = rec.followed_by(
                    (rec.version + 1, key, len(data)),
                    num_nodes=nxt.num_nodes,
                    num_edges=nxt.num_edges,
                    created=time.time(),
                    commit=uuid.uuid4().hex,
                )
                if publish(self.backend, new):
                    with self._lock:
                        if new.version > self.state.version:
                            self.state, self.record = nxt, new
                    return new, delta
                # another writer took this version: this segment is never referenced
                # (a later compaction removes it if this removal fails)
                with contextlib.suppress(Exception):
                    self.backend.rm(key)
        raise Unavailable(
            f"graph {self.name!r}: {attempt} versions in a row were taken by other writers "
            f"in {time.monotonic() - t0:.0f} s; retry"
        )

    def adopt(self, rec: VersionRecord, delta: Delta) -> GraphState:
        """Take a version another process committed (the gateway's writer process:
        gateway/graph_writer.py), its ``delta`` at hand, now: as :meth:`offer`
        and the check's merge at once; when it does not follow the current state
        (another writer's versions between) the state is brought up to ``rec``
        from the store. The new state is this process's current one when it
        returns (read-your-writes)."""
        self.offer(rec, delta)
        self._take_offered()
        if self.state.version < rec.version:
            self._advance(rec)
        return self.state

    def offer(self, rec: VersionRecord, delta: Delta) -> None:
        """A version another process committed for this one (the gateway's writer
        process), its delta at hand: taken with the next check (:meth:`poll`, at
        most ``freshness_s`` later, like any other gateway's version), in one
        merge with those offered meanwhile and without reading the store."""
        with self._offer_lock:
            self._offered.append((rec, delta))

    def _take_offered(self) -> None:
        """Apply the offered versions that follow the current state in a run (one
        :meth:`GraphState.apply_all`); what a gap leaves (another writer's
        versions between) the store check that follows reads."""
        with self._offer_lock:
            offered, self._offered = self._offered, []
        with self._lock:
            state, items, newest = self.state, [], None
            for rec, delta in sorted(offered, key=lambda o: o[0].version):  # a few a check
                at = state.version + len(items)
                if rec.version <= at:
                    continue
                last = rec.segments[-1] if rec.segments else None
                if rec.version != at + 1 or rec.base != state.graph.prefix or last is None:
                    break
                if last[0] != rec.version:
                    break
                items.append((delta, rec.version, last[1], int(last[2])))
                newest = rec
            if newest is not None:
                self.state, self.record = state.apply_all(items), newest

    # -- the refresher ---------------------------------------------------------------
    def start(self, interval_s: float | None = None) -> None:
        """Poll the store in the background every ``interval_s`` (default: a
        quarter of ``freshness_s``: a version is found and loaded well within the
        bound; an idle poll is one read, :meth:`poll`) so requests find the
        newest version already loaded."""
        if self.freshness_s <= 0 or self._thread is not None:
            return
        every = interval_s if interval_s is not None else self.freshness_s / 4

        def loop() -> None:
            while not self._stop.wait(every):
                try:
                    self.poll()
                except TransientStorageError as exc:  # the outage is logged once, by the store
                    log.debug("graph %s: version check failed: %s", self.name, exc)
                except Exception as exc:  # noqa: BLE001 - the next round tries again
                    log.warning("graph %s: refreshing its version failed: %s", self.name, exc)

        self._thread = threading.Thread(target=loop, daemon=True, name=f"versions-{self.name}")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
