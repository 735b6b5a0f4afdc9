"""Serving configuration: the ``limits`` section (request bounds) from YAML, and the
``buffers`` section as a model's BufferConfig."""

from __future__ import annotations

import dataclasses

import pytest

from gnn_faas.config import BufferSettings, LimitsConfig, ServingConfig, load_config
from gnn_faas.errors import InvalidRequest
from gnn_faas.gateway.buffer_pool import BufferConfig


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


def test_buffer_settings_reach_the_buffer_config():
    """Every setting of the ``buffers:`` section arrives in a model's BufferConfig
    (a new setting cannot be silently dropped), and the defaults agree."""
    config_fields = {f.name for f in dataclasses.fields(BufferConfig)}
    settings_fields = {f.name for f in dataclasses.fields(BufferSettings)}
    # tau_fraction becomes tau_s; tree names the timeout configurator's file
    assert settings_fields - config_fields == {"tau_fraction", "tree"}

    default = BufferConfig.from_settings(BufferSettings(), 0.3)
    assert default == dataclasses.replace(BufferConfig(slo_s=0.3), tau_s=default.tau_s)
    assert default.tau == pytest.approx(BufferConfig(slo_s=0.3).tau)

    changed = BufferSettings(num_buffers=7, gamma=0.2, tau_fraction=0.25, global_opt=False)
    cfg = BufferConfig.from_settings(changed, 0.6)
    assert (cfg.num_buffers, cfg.gamma, cfg.global_opt, cfg.slo_s) == (7, 0.2, False, 0.6)
    assert cfg.tau == pytest.approx(0.15)
    assert cfg.t0 == pytest.approx(0.12)
