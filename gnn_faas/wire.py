"""Binary frames between the gateway and the functions (docs/architecture.md, principle 5).

A frame is a safetensors buffer (MIME ``application/x-gnn-faas-frame``)::

    u64 little-endian N | N bytes JSON header | raw little-endian tensor bytes

The header maps each tensor name to ``{"dtype", "shape", "data_offsets"}``
and carries the call's parameters as one JSON string under
``__metadata__["params"]``. Frames are written with :func:`safetensors.numpy.save`
and read back here with explicit limits (body size, header size, tensor
count) and a full validation of the header before any byte is interpreted, so
a truncated or hostile frame is a 400 (or 413), never a crash, and decoding is
zero-copy (tensors are read-only views of the body). No pickle, no torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import safetensors.numpy

from gnn_faas.errors import InvalidRequest, PayloadTooLarge

FRAME_MIME = "application/x-gnn-faas-frame"
JSON_MIME = "application/json"
DEFAULT_MAX_BYTES = 256 << 20  # a whole request or response body
MAX_HEADER_BYTES = 1 << 20
MAX_TENSORS = 64
MAX_NDIM = 8

# safetensors dtype codes <-> numpy (explicit little-endian)
_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_KINDS = {(d.kind, d.itemsize) for d in _DTYPES.values()}


def encode_frame(
    tensors: Mapping[str, np.ndarray], params: Mapping[str, Any] | None = None
) -> bytes:
    """Serialise ``tensors`` (any numpy arrays) and JSON-able ``params`` into one frame."""
    if len(tensors) > MAX_TENSORS:
        raise InvalidRequest(f"a frame holds at most {MAX_TENSORS} tensors, got {len(tensors)}")
    flat = {}
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        if (arr.dtype.kind, arr.dtype.itemsize) not in _KINDS:
            raise InvalidRequest(f"tensor {name!r}: dtype {arr.dtype} cannot travel in a frame")
        flat[name] = np.ascontiguousarray(arr)
    metadata = {"params": json.dumps(dict(params or {}), separators=(",", ":"), allow_nan=False)}
    return safetensors.numpy.save(flat, metadata=metadata)


def _fail(msg: str) -> InvalidRequest:
    return InvalidRequest(f"invalid frame: {msg}")


def decode_frame(
    body: bytes | bytearray | memoryview,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_tensors: int = MAX_TENSORS,
    max_header_bytes: int = MAX_HEADER_BYTES,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Parse a frame into ``(tensors, params)``.

    Tensors are read-only zero-copy views of ``body``. Raises
    :class:`PayloadTooLarge` over ``max_bytes`` and :class:`InvalidRequest`
    for anything malformed (truncated, bad header, overlapping or
    out-of-bounds offsets, sizes that do not match shapes).
    """
    size = len(body)
    if size > max_bytes:
        raise PayloadTooLarge(f"frame of {size} bytes exceeds the limit of {max_bytes} bytes")
    if size < 8:
        raise _fail(f"truncated ({size} bytes, no header length)")
    n = int.from_bytes(bytes(body[:8]), "little")
    if n > max_header_bytes:
        raise _fail(f"header of {n} bytes exceeds the limit of {max_header_bytes} bytes")
    if 8 + n > size:
        raise _fail(f"truncated (header says {n} bytes, body has {size - 8})")
    try:
        header = json.loads(bytes(body[8 : 8 + n]))
    except (UnicodeDecodeError, ValueError):
        raise _fail("header is not valid JSON") from None
    if not isinstance(header, dict):
        raise _fail("header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise _fail("__metadata__ must be an object")
    if len(header) > max_tensors:
        raise _fail(f"{len(header)} tensors exceed the limit of {max_tensors}")
    data_len = size - 8 - n
    specs = []
    for name, spec in header.items():
        try:
            dtype = _DTYPES[spec["dtype"]]
            shape = tuple(spec["shape"])
            begin, end = spec["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise _fail(f"tensor {name!r} has a malformed entry") from None
        if len(shape) > MAX_NDIM or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise _fail(f"tensor {name!r} has an invalid shape {spec['shape']!r}")
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (begin, end)):
            raise _fail(f"tensor {name!r} has non-integer offsets")
        count = math.prod(shape)
        if not 0 <= begin <= end <= data_len:
            raise _fail(f"tensor {name!r} lies outside the body (truncated frame?)")
        if end - begin != count * dtype.itemsize:
            raise _fail(f"tensor {name!r}: {end - begin} bytes do not match shape {list(shape)}")
        specs.append((begin, end, name, dtype, shape, count))
    # safetensors requires the buffers to tile the data section exactly
    specs.sort(key=lambda s: (s[0], s[1]))
    pos = 0
    for begin, end, name, *_ in specs:
        if begin != pos:
            raise _fail(f"tensor {name!r} overlaps another or leaves a gap")
        pos = end
    if pos != data_len:
        raise _fail(f"{data_len - pos} trailing bytes after the last tensor")
    tensors = {}
    for begin, _end, name, dtype, shape, count in specs:
        arr = np.frombuffer(body, dtype=dtype, count=count, offset=8 + n + begin)
        tensors[name] = arr.reshape(shape)
    raw = meta.get("params", "{}")
    try:
        params = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        params = None
    if not isinstance(params, dict):
        raise _fail("__metadata__.params must be a JSON object string")
    return tensors, params


def decode_json(body: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """A JSON object body (small control calls)."""
    if len(body) > max_bytes:
        raise PayloadTooLarge(f"body of {len(body)} bytes exceeds the limit of {max_bytes} bytes")
    try:
        obj = json.loads(body or b"{}")
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest("body is not valid JSON") from None
    if not isinstance(obj, dict):
        raise InvalidRequest("JSON body must be an object")
    return obj


def require(
    tensors: Mapping[str, np.ndarray],
    name: str,
    dtype: str,
    ndim: int | tuple[int, ...],
    *,
    optional: bool = False,
) -> np.ndarray | None:
    """Tensor ``name`` checked for dtype and rank.

    ``dtype`` is an exact numpy name (``"float32"``, ``"int64"``) or a kind
    (``"f"`` any float, ``"i"`` any signed or unsigned integer). ``ndim`` is a
    rank or a tuple of allowed ranks. Returns ``None`` for an absent optional
    tensor; raises :class:`InvalidRequest` naming the tensor otherwise.
    """
    arr = tensors.get(name)
    if arr is None:
        if optional:
            return None
        raise InvalidRequest(f"missing tensor {name!r}")
    if dtype in ("f", "i"):
        ok = arr.dtype.kind == "f" if dtype == "f" else arr.dtype.kind in "iu"
    else:
        ok = arr.dtype == np.dtype(dtype)
    if not ok:
        raise InvalidRequest(f"tensor {name!r} must have dtype {dtype}, got {arr.dtype.name}")
    ranks = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if arr.ndim not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise InvalidRequest(
            f"tensor {name!r} must have {want} dimensions, got shape {list(arr.shape)}"
        )
    return arr


def params_get(params: Mapping[str, Any], key: str, kind: type | tuple, default: Any = ...) -> Any:
    """A typed parameter: ``InvalidRequest`` if missing (no default) or of the wrong type."""
    if key not in params or params[key] is None:
        if default is ...:
            raise InvalidRequest(f"missing parameter {key!r}")
        return default
    value = params[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) and bool not in kinds:
        raise InvalidRequest(f"parameter {key!r} must be {'/'.join(k.__name__ for k in kinds)}")
    if not isinstance(value, kinds):
        raise InvalidRequest(f"parameter {key!r} must be {'/'.join(k.__name__ for k in kinds)}")
    return value
