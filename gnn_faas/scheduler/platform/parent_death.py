"""Die with the parent: Linux ``PR_SET_PDEATHSIG`` through ctypes.

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


def _load_prctl():
    # loaded in the parent: a child between fork and exec must not dlopen
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl() if sys.platform.startswith("linux") else None


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
