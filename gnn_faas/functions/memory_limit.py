"""The memory a function instance may use, and what it uses now.

The limit, in order of precedence: an explicit ``--memory-mb``; the cgroup v2
``memory.max`` of this process's cgroup (what Kubernetes, Knative and Docker
set from the container's memory limit); the cgroup v1
``memory.limit_in_bytes``; else the machine's physical memory. A cgroup value
of ``max`` (v2) or a huge number (v1 writes ``PAGE_COUNTER_MAX`` pages) means
unlimited. The result never exceeds physical memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gnn_faas.errors import InvalidRequest

# cgroup v1 reports "no limit" as a page-rounded value near 2**63
_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class MemoryLimit:
    bytes: int
    source: str  # "flag", "cgroup2", "cgroup1" or "physical"

    @property
    def mib(self) -> float:
        return self.bytes / 2**20


def physical_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        import psutil

        return int(psutil.virtual_memory().total)


def _read_int(path: Path) -> int | None:
    """The integer in a cgroup file; ``None`` if absent, unreadable or unlimited."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= _UNLIMITED or value <= 0 else value


def _own_cgroup_paths(proc_cgroup: Path) -> tuple[str | None, str | None]:
    """This process's cgroup path for v2 (``0::/path``) and for the v1 memory controller."""
    v2 = v1 = None
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def cgroup_memory_limit(
    root: Path | str = "/sys/fs/cgroup", proc_cgroup: Path | str = "/proc/self/cgroup"
) -> tuple[int, str] | None:
    """``(bytes, "cgroup2"|"cgroup1")`` for the tightest limit found on this
    process's cgroup or its ancestors, or ``None`` when unlimited/unknown."""
    root, proc_cgroup = Path(root), Path(proc_cgroup)
    v2_path, v1_path = _own_cgroup_paths(proc_cgroup)
    candidates: list[tuple[Path, str]] = []
    if v2_path is not None:
        # inside a container the cgroup namespace makes our own cgroup the root
        rel = Path(v2_path.lstrip("/"))
        for p in (rel, *rel.parents):
            candidates.append((root / p / "memory.max", "cgroup2"))
    if v1_path is not None:
        rel = Path(v1_path.lstrip("/"))
        for p in (rel, *rel.parents):
            candidates.append((root / "memory" / p / "memory.limit_in_bytes", "cgroup1"))
    candidates.append((root / "memory.max", "cgroup2"))
    candidates.append((root / "memory" / "memory.limit_in_bytes", "cgroup1"))
    best: tuple[int, str] | None = None
    for path, kind in candidates:
        value = _read_int(path)
        if value is not None and (best is None or value < best[0]):
            best = (value, kind)
    return best


def detect_memory_limit(
    memory_mb: float | None = None,
    root: Path | str = "/sys/fs/cgroup",
    proc_cgroup: Path | str = "/proc/self/cgroup",
) -> MemoryLimit:
    """The instance's memory limit (see the module docstring for the precedence)."""
    physical = physical_memory_bytes()
    if memory_mb is not None:
        if not memory_mb > 0:
            raise InvalidRequest(f"--memory-mb must be positive, got {memory_mb}")
        return MemoryLimit(int(memory_mb * 2**20), "flag")
    found = cgroup_memory_limit(root, proc_cgroup)
    if found is not None and found[0] < physical:
        return MemoryLimit(found[0], found[1])
    return MemoryLimit(physical, "physical")


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of a process (this one by default), from ``/proc`` when
    present (cheap), else psutil."""
    path = f"/proc/{pid or 'self'}/statm"
    try:
        with open(path) as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import psutil

        return int(psutil.Process(pid).memory_info().rss)


def anon_rss_bytes(pid: int | None = None) -> int:
    """The private (anonymous) part of a process's resident set: ``resident -
    shared`` of ``/proc/PID/statm``. What a process allocated itself, without
    the pages of files it maps: a memory function on the file store maps the
    graph's blobs, and every store page it touched (with the kernel's
    fault-around, 64 KiB a fault) counts in its RSS while staying page cache,
    shared and reclaimable. 0 where ``/proc`` is absent."""
    try:
        with open(f"/proc/{pid or 'self'}/statm") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# Feature rows are read from the store in chunks of at most limit / STREAM_SHARE
# needed bytes (KHopFetcher.read_features' max_buffer_bytes): a chunk's read
# buffer, at most (1 + MAX_OVERREAD) x the chunk, and its gathered rows take up
# to 3 chunks (24 MiB of 1 GiB) beside the rows of the call.
STREAM_SHARE = 128
MIN_STREAM_BYTES = 1 << 16
STREAM_CHUNKS = 3
CALL_BOOKKEEPING_BYTES = 1 << 20  # tracemalloc's and the frame decoder's own


def feature_stream_bytes(limit_bytes: int) -> int:
    """Needed bytes of one chunk of a memory function's streamed feature read."""
    return max(MIN_STREAM_BYTES, int(limit_bytes) // STREAM_SHARE)


def call_overhead_bytes(limit_bytes: int) -> int:
    """What one Aggregate call of a memory function with ``limit_bytes`` holds
    beyond the partitioner's ``M_V + M_E + M_h`` whatever the part's size: its
    feature stream's chunks and a MiB of bookkeeping (the answer's frame, a
    second copy of ``M_h``, grows with the part and is counted there)."""
    return STREAM_CHUNKS * feature_stream_bytes(limit_bytes) + CALL_BOOKKEEPING_BYTES
