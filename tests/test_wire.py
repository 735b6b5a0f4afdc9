"""Binary frames: round trips, interoperability with safetensors, and limits."""

from __future__ import annotations

import contextlib
import json
import struct

import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st

from gnn_faas.errors import InvalidRequest, PayloadTooLarge
from gnn_faas.storage.computation_graph import cg_from_tensors, cg_tensors
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.wire import (
    decode_frame,
    decode_json,
    encode_frame,
    params_get,
    require,
)


def _frame(header: dict, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def test_round_trip_dtypes_shapes_and_params():
    rng = np.random.default_rng(0)
    tensors = {
        "f32": rng.standard_normal((3, 4, 2)).astype(np.float32),
        "i64": np.arange(7, dtype=np.int64) - 3,
        "i32": np.array([[1, -2]], dtype=np.int32),
        "f16": np.array([0.5, 2.0], dtype=np.float16),
        "u8": np.arange(5, dtype=np.uint8),
        "b": np.array([True, False]),
        "empty": np.zeros((0, 16), dtype=np.float32),
    }
    params = {"op": "gcn", "num_dst": 3, "eps": 0.5, "flags": [1, None], "nested": {"a": "b"}}
    out, p = decode_frame(encode_frame(tensors, params))
    assert p == params
    assert set(out) == set(tensors)
    for k, v in tensors.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape
        np.testing.assert_array_equal(out[k], v)


def test_big_endian_and_noncontiguous_inputs_travel_little_endian():
    a = np.arange(12, dtype=">f4").reshape(3, 4)
    out, _ = decode_frame(encode_frame({"a": a, "t": a.T}))
    assert out["a"].dtype == np.dtype("<f4")
    np.testing.assert_array_equal(out["a"], a)
    np.testing.assert_array_equal(out["t"], a.T)


def test_interoperates_with_safetensors():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    # our frames are safetensors buffers ...
    loaded = safetensors.numpy.load(encode_frame({"x": x}, {"k": 1}))
    np.testing.assert_array_equal(loaded["x"], x)
    # ... and plain safetensors buffers are frames (no params)
    out, params = decode_frame(safetensors.numpy.save({"x": x}))
    np.testing.assert_array_equal(out["x"], x)
    assert params == {}


def test_decoded_tensors_are_read_only_views():
    out, _ = decode_frame(encode_frame({"x": np.ones(4, np.float32)}))
    assert not out["x"].flags.writeable


def test_every_truncation_is_a_400():
    body = encode_frame({"a": np.arange(10, dtype=np.int64), "b": np.ones((2, 2), np.float32)})
    for cut in [0, 1, 7, 8, 9, 20, len(body) // 2, len(body) - 1]:
        with pytest.raises(InvalidRequest) as info:
            decode_frame(body[:cut])
        assert not isinstance(info.value, PayloadTooLarge)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_is_a_400_never_a_crash(data):
    with contextlib.suppress(InvalidRequest):  # the only failure allowed
        decode_frame(data)


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=400), st.integers(min_value=0, max_value=255))
def test_corrupted_byte_is_rejected_or_decodes_consistently(pos, value):
    body = bytearray(encode_frame({"a": np.arange(6, dtype=np.int64)}, {"op": "sum"}))
    body[pos % len(body)] = value
    try:
        tensors, params = decode_frame(bytes(body))
    except InvalidRequest:
        return
    for t in tensors.values():  # whatever decodes lies inside the body
        assert t.nbytes <= len(body)
    assert isinstance(params, dict)


def test_oversized_body_is_413():
    body = encode_frame({"x": np.zeros(1000, np.float32)})
    with pytest.raises(PayloadTooLarge):
        decode_frame(body, max_bytes=len(body) - 1)
    decode_frame(body, max_bytes=len(body))


@pytest.mark.parametrize(
    "header, data, message",
    [
        ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "outside"),
        ({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "match"),
        ({"x": {"dtype": "Q99", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "malformed"),
        ({"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, "shape"),
        ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 12, "trailing"),
        (
            {
                "x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            b"\0" * 12,
            "overlaps",
        ),
        ({"__metadata__": {"params": "[1, 2]"}}, b"", "params"),
        ({"__metadata__": {"params": "{not json"}}, b"", "params"),
    ],
)
def test_malformed_headers(header, data, message):
    with pytest.raises(InvalidRequest, match=message):
        decode_frame(_frame(header, data))


def test_header_and_tensor_count_limits():
    with pytest.raises(InvalidRequest, match="header"):
        decode_frame(struct.pack("<Q", 10**9) + b"{}", max_bytes=10**10)
    many = {f"t{i}": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]} for i in range(70)}
    with pytest.raises(InvalidRequest, match="tensors"):
        decode_frame(_frame(many))
    with pytest.raises(InvalidRequest, match="at most"):
        encode_frame({f"t{i}": np.zeros(1) for i in range(65)})
    with pytest.raises(InvalidRequest, match="JSON"):
        decode_frame(struct.pack("<Q", 3) + b"\xff\xfe{")


def test_unsupported_dtype_cannot_be_encoded():
    with pytest.raises(InvalidRequest, match="dtype"):
        encode_frame({"c": np.array([1 + 2j])})


def test_require_checks_name_dtype_and_rank():
    t = {"h": np.zeros((2, 3), np.float32), "i": np.zeros(3, np.int32)}
    assert require(t, "h", "float32", 2) is t["h"]
    assert require(t, "h", "f", (2, 3)) is t["h"]
    assert require(t, "i", "i", 1) is t["i"]
    assert require(t, "x", "f", 1, optional=True) is None
    with pytest.raises(InvalidRequest, match="missing tensor 'x'"):
        require(t, "x", "f", 1)
    with pytest.raises(InvalidRequest, match="'i' must have dtype int64"):
        require(t, "i", "int64", 1)
    with pytest.raises(InvalidRequest, match="'h' must have 1 or 3 dimensions"):
        require(t, "h", "float32", (1, 3))


def test_params_get_types():
    p = {"n": 3, "f": 1, "b": True, "s": "x", "none": None}
    assert params_get(p, "n", int) == 3
    assert params_get(p, "f", float) == 1.0 and isinstance(params_get(p, "f", float), float)
    assert params_get(p, "b", bool) is True
    assert params_get(p, "none", int, 7) == 7
    with pytest.raises(InvalidRequest, match="must be int"):
        params_get(p, "b", int)  # a bool is not an int here
    with pytest.raises(InvalidRequest, match="must be int"):
        params_get(p, "s", int)
    with pytest.raises(InvalidRequest, match="missing parameter 'q'"):
        params_get(p, "q", int)


def test_decode_json():
    assert decode_json(b'{"a": 1}') == {"a": 1}
    assert decode_json(b"") == {}
    with pytest.raises(InvalidRequest):
        decode_json(b"[1]")
    with pytest.raises(InvalidRequest):
        decode_json(b"{")
    with pytest.raises(PayloadTooLarge):
        decode_json(b'{"a": 1}', max_bytes=3)


def test_computation_graph_round_trip(tmp_path):
    fetcher = KHopFetcher(ensure_dataset(f"file://{tmp_path}", "bitcoin-otc"))
    cg = fetcher.fetch([5, 17, 5], 2, fanouts=[4, 3], seed=1, degrees=True)
    back = cg_from_tensors(decode_frame(encode_frame(cg_tensors(cg)))[0])
    assert back.layer_sizes == cg.layer_sizes
    for name in ("nodes", "indptr", "indices", "target_index", "in_degree"):
        np.testing.assert_array_equal(getattr(back, name), getattr(cg, name))
    with pytest.raises(InvalidRequest, match="lacks"):
        cg_from_tensors({"nodes": cg.nodes})
