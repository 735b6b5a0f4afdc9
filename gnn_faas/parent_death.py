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


def _load_libc():
    # loaded in the parent: a child between fork and exec must not dlopen
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc() if sys.platform.startswith("linux") else None
_PRCTL = getattr(_LIBC, "prctl", None)
_MALLOPT = getattr(_LIBC, "mallopt", None)


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas (``mallopt(M_ARENA_MAX)``). By default glibc gives
    threads up to 8 arenas per core; a threaded server whose requests allocate
    buffers of varying sizes then holds freed memory spread over many arenas
    and its RSS creeps up. Call before the threads start."""
    if _MALLOPT is None:
        return False
    return _MALLOPT(M_ARENA_MAX, int(arenas)) == 1


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
