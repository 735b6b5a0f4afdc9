"""``gnn-faas deploy openfaas --stack``: the faas-cli stack file."""

from __future__ import annotations

import pytest
import yaml

from gnn_faas.cli import main

CONFIG = {
    "store": "s3://bucket/graphs",
    "platform": {
        "kind": "openfaas",
        "memory_function_mb": 384,
        "memory_vcpus": 0.5,
        "compute_function_mb": 1024,
        "max_memory_instances": 6,
        "min_instances": 0,
        "keep_alive_s": 300,
        "openfaas": {"concurrency": 2},
    },
    "models": [{"name": "btc", "graph": "bitcoin-otc"}, {"name": "cora", "graph": "cora"}],
}


def test_stack_file_has_every_function(tmp_path):
    cfg = tmp_path / "serving.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    out = tmp_path / "stack.yml"
    argv = ["deploy", "openfaas", "--stack", str(out), "--config", str(cfg), "--registry",
            "ghcr.io/acme", "--tag", "9.9", "--secret", "s3-creds",
            "--gateway", "http://gw:8080"]  # fmt: skip
    assert main(argv) == 0
    stack = yaml.safe_load(out.read_text())
    assert stack["provider"] == {"name": "openfaas", "gateway": "http://gw:8080"}
    assert set(stack["functions"]) == {"btc-memory", "btc-compute", "cora-memory", "cora-compute"}
    mem = stack["functions"]["btc-memory"]
    assert mem["image"] == "ghcr.io/acme/gnn-faas-memory:9.9" and mem["skip_build"] is True
    assert mem["environment"]["GNN_FAAS_STORE"] == "s3://bucket/graphs"
    assert mem["environment"]["GNN_FAAS_GRAPH"] == "bitcoin-otc"
    assert mem["limits"] == mem["requests"] == {"memory": "384Mi", "cpu": "500m"}
    assert mem["readonly_root_filesystem"] is True
    assert mem["secrets"] == ["s3-creds"]
    labels = mem["labels"]
    assert labels["gnn-faas.io/function"] == "btc-memory"  # what the backend looks for
    assert labels["com.openfaas.scale.min"] == "0"
    assert labels["com.openfaas.scale.max"] == "3"  # 6 slots / concurrency 2
    assert labels["com.openfaas.scale.target"] == "2"
    assert labels["com.openfaas.scale.zero"] == "true"
    assert labels["com.openfaas.scale.zero-duration"] == "5m"
    comp = stack["functions"]["cora-compute"]
    assert comp["limits"]["memory"] == "1024Mi"
    assert all(
        isinstance(v, str) for f in stack["functions"].values() for v in f["labels"].values()
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gateway", "gw:8080"], "must be an http(s) URL"),
        (["--config", "/nonexistent.yaml"], "config file not found"),
    ],
)
def test_bad_arguments_are_clear_errors(tmp_path, capsys, argv, message):
    assert main(["deploy", "openfaas", "--stack", str(tmp_path / "s.yml"), *argv]) == 2
    assert message in capsys.readouterr().err
