"""Instance memory limit: --memory-mb, cgroup v2, cgroup v1, physical memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.memory_limit import (
    anon_rss_bytes,
    cgroup_memory_limit,
    detect_memory_limit,
    physical_memory_bytes,
    rss_bytes,
)

MiB = 2**20


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _tree(tmp_path: Path, proc: str) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    root.mkdir()
    proc_file = tmp_path / "proc_self_cgroup"
    proc_file.write_text(proc)
    return root, proc_file


def test_flag_wins(tmp_path):
    root, proc = _tree(tmp_path, "0::/pod\n")
    _write(root / "pod" / "memory.max", str(64 * MiB))
    lim = detect_memory_limit(300, root, proc)
    assert (lim.bytes, lim.source) == (300 * MiB, "flag")
    with pytest.raises(InvalidRequest, match="memory-mb"):
        detect_memory_limit(0, root, proc)


def test_cgroup_v2_own_cgroup_and_ancestors(tmp_path):
    root, proc = _tree(tmp_path, "0::/kubepods/pod1/ctr\n")
    _write(root / "kubepods" / "pod1" / "ctr" / "memory.max", "max\n")
    _write(root / "kubepods" / "pod1" / "memory.max", f"{512 * MiB}\n")
    _write(root / "kubepods" / "memory.max", f"{2048 * MiB}\n")
    lim = detect_memory_limit(None, root, proc)
    assert (lim.bytes, lim.source) == (512 * MiB, "cgroup2")


def test_cgroup_v2_namespaced_root(tmp_path):
    # inside a container's cgroup namespace the own cgroup is "/" and the limit is at the root
    root, proc = _tree(tmp_path, "0::/\n")
    _write(root / "memory.max", f"{256 * MiB}\n")
    assert detect_memory_limit(None, root, proc).bytes == 256 * MiB


def test_cgroup_v1_limit_and_unlimited(tmp_path):
    root, proc = _tree(tmp_path, "4:memory:/docker/abc\n1:cpu:/\n")
    _write(root / "memory" / "docker" / "abc" / "memory.limit_in_bytes", f"{768 * MiB}\n")
    assert cgroup_memory_limit(root, proc) == (768 * MiB, "cgroup1")
    # v1 writes PAGE_COUNTER_MAX pages for "no limit": physical memory it is
    _write(root / "memory" / "docker" / "abc" / "memory.limit_in_bytes", "9223372036854771712\n")
    assert cgroup_memory_limit(root, proc) is None
    lim = detect_memory_limit(None, root, proc)
    assert (lim.bytes, lim.source) == (physical_memory_bytes(), "physical")


def test_garbage_and_missing_files_mean_no_limit(tmp_path):
    root, proc = _tree(tmp_path, "0::/x\n")
    _write(root / "x" / "memory.max", "lots\n")
    assert cgroup_memory_limit(root, proc) is None
    assert cgroup_memory_limit(tmp_path / "nowhere", tmp_path / "no_proc") is None


def test_limit_above_physical_is_physical(tmp_path):
    root, proc = _tree(tmp_path, "0::/\n")
    _write(root / "memory.max", str(physical_memory_bytes() * 4))
    assert detect_memory_limit(None, root, proc).source == "physical"


def test_this_machine_and_rss():
    lim = detect_memory_limit()
    assert 0 < lim.bytes <= physical_memory_bytes()
    rss = rss_bytes()
    assert 10 * MiB < rss < lim.bytes
    assert rss_bytes(os.getpid()) > 0


def test_anon_rss_leaves_out_mapped_file_pages(tmp_path):
    """A mapped file's touched pages count in RSS, not in the private part
    (a memory function on the file store maps the graph's blobs)."""
    import mmap

    import numpy as np

    path = tmp_path / "blob"
    path.write_bytes(np.arange(8 * MiB // 8, dtype=np.int64).tobytes())  # in the page cache now
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        view = np.frombuffer(mm, dtype=np.uint8)
        rss0, anon0 = rss_bytes(), anon_rss_bytes()
        assert 0 < anon0 <= rss0
        touched = int(view[:: mmap.PAGESIZE].sum())  # one byte a page: every page mapped
        rss1, anon1 = rss_bytes(), anon_rss_bytes()
        assert touched >= 0
        assert rss1 - rss0 >= 6 * MiB  # the file's pages are resident in this process
        assert anon1 - anon0 < 2 * MiB  # but not private memory
        del view
    finally:
        mm.close()
