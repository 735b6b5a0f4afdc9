"""Where a served precomputed model's recomputed candidates get layer 1 from:
their stored states where the model and the stored set allow it, else their
neighbourhoods, with the reason the gateway reports."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gnn_faas.config import ModelServingConfig
from gnn_faas.functions.layer_plan import ModelPlan
from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.gateway.data_plane import recompute_source


def plan(arch: str, layers: int, **kw) -> ModelPlan:
    cfg = ModelConfig(arch=arch, in_dim=8, hidden_dim=4, out_dim=3, num_layers=layers,
                      num_classes=3, **kw)  # fmt: skip
    return ModelPlan.from_config(cfg)


def stored(states: bool):
    return SimpleNamespace(has_states=lambda layer: states and layer == 1)


@pytest.mark.parametrize(
    "arch,layers,kw,states,want,reason",
    [
        ("gcn", 2, {}, True, "state", None),
        ("sage", 2, {"aggr": "max"}, True, "state", None),
        ("gin", 2, {}, True, "state", None),
        ("gcn", 3, {}, True, "neighbourhood", "2-layer models, this one has 3"),
        ("gat", 2, {"heads": 2}, True, "neighbourhood", "layer 1 (gat) keeps no aggregate state"),
        ("gcn", 2, {}, False, "neighbourhood", "rerun 'gnn-faas precompute --model m'"),
    ],
)
def test_state_where_the_model_and_the_set_allow_it(arch, layers, kw, states, want, reason):
    model = ModelServingConfig(name="m", embeddings="precomputed")
    got, why = recompute_source(model, plan(arch, layers, **kw), stored(states))
    assert got == want
    assert (why is None) if reason is None else (reason in why)


def test_asked_for_neighbourhoods_and_exact_serving():
    asked = ModelServingConfig(name="m", embeddings="precomputed", recompute_from="neighbourhood")
    assert recompute_source(asked, plan("gcn", 2), stored(True)) == ("neighbourhood", None)
    assert recompute_source(ModelServingConfig(), plan("gcn", 2), None) == (None, None)


def test_an_unknown_recompute_from_is_refused():
    from gnn_faas.config import ServingConfig, from_dict
    from gnn_faas.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="recompute_from"):
        from_dict(ServingConfig, {"models": [{"name": "m", "recompute_from": "cache"}]})
