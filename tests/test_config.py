"""Serving configuration: the ``limits`` section (request bounds) from YAML."""

from __future__ import annotations

import pytest

from gnn_faas.config import LimitsConfig, ServingConfig, load_config
from gnn_faas.errors import InvalidRequest


def test_limits_section_from_yaml(tmp_path):
    path = tmp_path / "serving.yaml"
    path.write_text("limits: {max_body_bytes: 4096, max_json_depth: 8}\n")
    cfg = load_config(path)
    assert cfg.limits == LimitsConfig(max_body_bytes=4096, max_json_depth=8)
    assert ServingConfig().limits == LimitsConfig()  # safe defaults without the section


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("limits: {max_depth: 3}\n", "limits: unknown key(s) 'max_depth'"),
        ("limits: {max_inputs: 0}\n", "limits.max_inputs: 0 is not allowed; allowed: integer in"),
        ("limits: {max_rank: true}\n", "limits.max_rank: True is not allowed; allowed: integer"),
        ("gateway: {max_body_bytes: 10}\n", "gateway: unknown key(s) 'max_body_bytes'"),
        ("models: [{name: m, max_targets: 0}]\n", "models[0].max_targets: 0 is not allowed"),
    ],
)
def test_bad_limits_are_clear_errors(tmp_path, text, message):
    path = tmp_path / "serving.yaml"
    path.write_text(text)
    with pytest.raises(InvalidRequest) as err:
        load_config(path)
    assert message in str(err.value)
