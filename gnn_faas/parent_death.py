"""Process hygiene through libc (ctypes): die with the parent, bound malloc arenas.

``PR_SET_PDEATHSIG`` (Linux ``prctl``):
The kernel sends the signal when the *thread* that forked the process exits
(not the whole parent process): fork from a thread that lives as long as the
process. A no-op (returns False) where ``prctl`` is not available.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
M_ARENA_MAX = -8  # mallopt parameter (glibc)
M_MMAP_THRESHOLD = -3  # mallopt parameter (glibc)


def _load_libc():
    # loaded in the parent: a child between fork and exec must not dlopen
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc() if sys.platform.startswith("linux") else None
_PRCTL = getattr(_LIBC, "prctl", None)
_MALLOPT = getattr(_LIBC, "mallopt", None)
_MALLOC_TRIM = getattr(_LIBC, "malloc_trim", None)


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas (``mallopt(M_ARENA_MAX)``). By default glibc gives
    threads up to 8 arenas per core; a threaded server whose requests allocate
    buffers of varying sizes then holds freed memory spread over many arenas
    and its RSS creeps up. Call before the threads start."""
    if _MALLOPT is None:
        return False
    return _MALLOPT(M_ARENA_MAX, int(arenas)) == 1


def fix_mmap_threshold(nbytes: int = 1 << 20) -> bool:
    """Serve every allocation of at least ``nbytes`` with its own ``mmap``
    (``mallopt(M_MMAP_THRESHOLD)``), returned to the OS when freed. glibc's
    default threshold is dynamic: each freed mmapped block raises it (up to
    32 MiB), so after a few large request bodies the next ones come from the
    heap, and the heap keeps its peak. Setting it fixes it."""
    if _MALLOPT is None:
        return False
    return _MALLOPT(M_MMAP_THRESHOLD, int(nbytes)) == 1


def malloc_trim() -> bool:
    """Give glibc's free heap memory back to the OS (``malloc_trim(0)``); a few
    milliseconds on a large heap: call after a large request, not after each."""
    if _MALLOC_TRIM is None:
        return False
    return bool(_MALLOC_TRIM(0))


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent thread exits."""
    if _PRCTL is None:
        return False
    return _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def die_with(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child, between fork and exec
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec
