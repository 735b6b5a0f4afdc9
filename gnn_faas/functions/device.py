"""Which torch device a compute function's Update runs on.

``--device`` / ``device:`` is ``auto`` (CUDA when a device is visible, else
the CPU), ``cpu``, ``cuda`` or ``cuda:N``. :func:`parse_device` checks the
spelling without torch, so the gunicorn master validates its arguments and
never touches CUDA (a CUDA context does not survive a fork);
:func:`select_device` runs in the worker, after the fork, and asks torch.
:func:`resolve_device` is the decision itself, a pure function the tests
drive with and without a visible GPU.
"""

from __future__ import annotations

import re

from gnn_faas.errors import InvalidRequest

DEVICE_CHOICES = ("auto", "cpu", "cuda")
_CUDA = re.compile(r"^cuda(?::(\d+))?$")


def parse_device(text: str | None) -> str:
    """The normalised request (``None`` -> ``"auto"``), or InvalidRequest."""
    value = (text or "auto").strip().lower()
    if value in ("auto", "cpu") or _CUDA.match(value):
        return value
    raise InvalidRequest(f"device must be auto, cpu, cuda or cuda:N, not {text!r}")


def resolve_device(requested: str | None, cuda_available: bool, device_count: int = 0) -> str:
    """The torch device string for ``requested`` given what is visible.

    ``auto`` takes ``cuda`` when available, else ``cpu``; an explicit CUDA
    device that is not visible is an error (never a silent CPU fallback).
    """
    value = parse_device(requested)
    if value == "auto":
        return "cuda" if cuda_available else "cpu"
    if value == "cpu":
        return "cpu"
    if not cuda_available:
        raise InvalidRequest(
            f"device {value!r} requested but no CUDA device is visible "
            "(torch.cuda.is_available() is False); use --device cpu or auto"
        )
    m = _CUDA.match(value)
    index = int(m.group(1)) if m and m.group(1) is not None else 0
    if index >= max(1, device_count):
        raise InvalidRequest(f"device {value!r}: only {device_count} CUDA device(s) visible")
    return value


def select_device(requested: str | None) -> str:
    """:func:`resolve_device` against this process's torch (call after the fork)."""
    import torch

    available = torch.cuda.is_available()
    return resolve_device(requested, available, torch.cuda.device_count() if available else 0)
