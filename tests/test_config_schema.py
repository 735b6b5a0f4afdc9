"""The serving config's schema: every field with a bad value is one clear line, exit 2.

The walk covers every key of :data:`gnn_faas.config_schema.SCHEMA` (and a test
checks that every field of the config dataclasses is in it): each gets a value
out of its range, of the wrong type (``true`` for a number: bool is not an
int) or outside its enum; the error must be exactly one line that names the
key's path and what it allows.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest
import yaml

from gnn_faas.cli import main
from gnn_faas.config import ServingConfig, load_config
from gnn_faas.config_schema import SCHEMA, errors
from gnn_faas.errors import InvalidRequest


def _leaves(schema: dict, path: tuple = ()) -> list[tuple[tuple, dict]]:
    """(path, subschema) of every leaf key; ``models`` items as ``models[0]``."""
    out = []
    for key, sub in schema.get("properties", {}).items():
        here = (*path, key)
        if "properties" in sub:
            out += _leaves(sub, here)
        elif sub.get("type") == "array" and "properties" in sub.get("items", {}):
            out += _leaves(sub["items"], (*here, 0))
        else:
            out.append((here, sub))
    return out


def _bad_values(sub: dict) -> list:
    """Values ``sub`` must refuse: past each bound, the wrong type, off the enum."""
    types = sub.get("type")
    types = [types] if isinstance(types, str) else list(types)
    if "enum" in sub:
        return ["no-such-choice", 3]
    if "integer" in types or "number" in types:
        bad = [True, "1"]  # a bool is not a number; nor is a string
        if "integer" in types:
            bad.append(1.5)
        if "minimum" in sub:
            bad.append(sub["minimum"] - 1)
        if "exclusiveMinimum" in sub:
            bad.append(sub["exclusiveMinimum"])
        if "maximum" in sub:
            bad.append(sub["maximum"] + 1)
        return bad
    if "boolean" in types:
        return ["yes", 1]
    if "array" in types:
        return [[0, 5], [5, -2], ["5"], "5", []]
    if "string" in types:
        bad = [5, ["a"]]
        if sub.get("minLength") or "pattern" in sub:
            bad.append("")
        return bad
    raise AssertionError(f"no bad value for {sub}")


def _document(path: tuple, value) -> dict:
    doc: dict = {}
    node = doc
    for i, key in enumerate(path[:-1]):
        if isinstance(path[i + 1], int):
            node[key] = [{"name": "m"}] if key == "models" else [{}]
            node = node[key][0]
        elif isinstance(key, int):
            continue
        else:
            node = node.setdefault(key, {})
    node[path[-1]] = value
    return doc


def _dotted(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


CASES = [
    pytest.param(path, value, id=f"{_dotted(path)}={value!r}")
    for path, sub in _leaves(SCHEMA)
    for value in _bad_values(sub)
]


@pytest.mark.parametrize(("path", "value"), CASES)
def test_every_field_refuses_a_bad_value_in_one_line(tmp_path, path, value):
    file = tmp_path / "serving.yaml"
    file.write_text(yaml.safe_dump(_document(path, value)))
    with pytest.raises(InvalidRequest) as err:
        load_config(file)
    message = str(err.value)
    assert "\n" not in message
    assert f"{file}: {_dotted(path)}" in message
    assert "allowed: " in message


def test_every_config_field_is_in_the_schema():
    def walk(cls, schema, where):
        props = schema["properties"]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            assert f.name in props, f"{where}.{f.name} has no schema entry"
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, props[f.name], f"{where}.{f.name}")
            elif f.name == "models":
                walk(typing.get_args(tp)[0], props["models"]["items"], "models[]")

    walk(ServingConfig, SCHEMA, "config")


def test_the_enums_match_what_the_code_accepts():
    from gnn_faas.scheduler.platform import PLATFORMS

    assert set(SCHEMA["properties"]["platform"]["properties"]["kind"]["enum"]) == set(PLATFORMS)


def test_good_configs_pass_and_every_error_is_reported():
    good = {
        "gateway": {"port": 0, "threads": 4, "admission_headroom": 1, "keepalive_s": 5},
        "buffers": {"objective": "latency", "latency_slack": 0.0},
        "models": [{"name": "m", "fanouts": [10, 5], "slo_s": 1}],
    }
    assert errors(good) == []
    bad = {"gateway": {"port": -5, "threads": 0}, "models": [{"name": "m", "layers": 0}]}
    lines = errors(bad)
    assert len(lines) == 3
    assert any(line.startswith("gateway.port: -5 ") for line in lines)
    assert any("integer in [0, 65535]" in line for line in lines)


def test_up_exits_2_with_the_lines_before_anything_starts(tmp_path, capsys):
    file = tmp_path / "serving.yaml"
    file.write_text("gateway: {port: 70000, threads: 0}\nmodels: [{name: m, layers: 0}]\n")
    assert main(["up", "--config", str(file)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "gateway.port: 70000 is not allowed; allowed: integer in [0, 65535]" in err
    assert "gateway.threads: 0 is not allowed" in err
    assert "models[0].layers: 0 is not allowed" in err
    assert main(["up", "--port", "-5"]) == 2
    assert "--port: -5 is not allowed" in capsys.readouterr().err
