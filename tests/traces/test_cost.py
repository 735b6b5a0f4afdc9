"""Cost arithmetic against hand-computed cases, and the price file's checks."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest
from gnn_faas.traces.cost import (
    dollars,
    load_prices,
    policy_storage_requests,
    storage_dollars,
    storage_price_for,
)


@pytest.fixture(scope="module")
def prices():
    return load_prices()


def test_every_price_names_source_and_date(prices):
    assert {"lambda_x86", "lambda_arm", "cloud_run", "ec2_c4_2xlarge", "ec2_c7i_2xlarge"} <= set(
        prices
    )
    for p in prices.values():
        assert p.source.startswith("https://") and p.date


def test_lambda_hand_computed(prices):
    lam = prices["lambda_x86"]
    # 1.2 ms bills 2 ms; 3 ms bills 3 ms; at 512 MB: (0.002 + 0.003)·0.5 GB-s
    usd = lam.faas_cost(np.array([0.0012, 0.003]), 512.0)
    assert usd == pytest.approx(0.005 * 0.5 * 0.0000166667 + 2 * 0.20 / 1e6, rel=1e-12)
    one_million_1s_1gb = lam.faas_cost(np.ones(10), 1024.0) / 10 * 1e6
    assert one_million_1s_1gb == pytest.approx(16.6667 + 0.20, rel=1e-9)
    assert prices["lambda_arm"].faas_cost(np.array([1.0]), 2048.0) == pytest.approx(
        2 * 0.0000133334 + 0.2e-6
    )


def test_cloud_run_hand_computed(prices):
    cr = prices["cloud_run"]
    # 0.25 s bills 0.3 s (100 ms units); 1 GiB and 2 vCPUs
    usd = cr.faas_cost(np.array([0.25]), 1024.0, 2.0)
    assert usd == pytest.approx(0.3 * 0.0000025 + 0.3 * 2 * 0.000024 + 0.40 / 1e6)


def test_serverful_fleet_sized_to_peak(prices):
    c4 = prices["ec2_c4_2xlarge"]  # 8 vCPUs, 15 GiB, $0.398/h
    assert c4.machines(peak_vcpus=17) == 3
    assert c4.machines(peak_vcpus=2, peak_gib=31) == 3
    assert c4.serverful_cost(7200.0, peak_vcpus=16) == pytest.approx(2 * 0.398 * 2)
    d = dollars(prices, serverful=True, durations_s=np.zeros(0), memory_mb=0, vcpus=0,
                duration_s=3600.0, peak_vcpus=8, peak_gib=1, requests=1000)  # fmt: skip
    assert d["ec2_c7i_2xlarge"] == pytest.approx(0.357)
    assert d["ec2_c7i_2xlarge_per_million"] == pytest.approx(357.0)
    assert "lambda_x86" not in d


def test_bad_price_files(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("prices:\n  x:\n    kind: faas\n    gb_s: 1\n")
    with pytest.raises(InvalidRequest, match="lacks"):
        load_prices(p)
    p.write_text("prices:\n  x:\n    kind: spot\n")
    with pytest.raises(InvalidRequest, match="kind"):
        load_prices(p)


def test_storage_prices_name_source_and_date(prices):
    s3 = prices["s3_standard"]
    assert (s3.kind, s3.scheme, s3.get_per_thousand, s3.put_per_thousand) == (
        "storage", "s3", 0.0004, 0.005,
    )  # fmt: skip
    redis = prices["elasticache_redis"]
    assert (redis.kind, redis.scheme) == ("storage_node", "redis") and redis.per_hour > 0
    assert storage_price_for(prices, "s3") is s3 and storage_price_for(prices, "file") is None
    # storage prices never bill compute
    d = dollars(prices, serverful=False, durations_s=np.array([1.0]), memory_mb=1024.0,
                vcpus=1.0, duration_s=1.0, peak_vcpus=1, peak_gib=1, requests=1)  # fmt: skip
    assert "s3_standard" not in d and "elasticache_redis" not in d


def test_storage_requests_hand_computed(prices):
    s3 = prices["s3_standard"]
    # 720 GETs per query (the unplanned 2-hop fetch on Bitcoin OTC) for a million
    # queries: 720e6 · 0.0004 / 1000 = $288; 5 GETs per query: $2
    assert s3.request_cost(720e6) == pytest.approx(288.0)
    assert s3.request_cost(5e6) == pytest.approx(2.0)
    # 2,000 GETs and 300 PUTs: 0.0008 + 0.0015
    assert s3.request_cost(2000, 300) == pytest.approx(0.0023)
    redis = prices["elasticache_redis"]
    # a 20 GiB graph needs 2 nodes of 13.07 GiB; 3 hours
    assert redis.node_cost(3 * 3600.0, 20.0) == pytest.approx(2 * 3 * redis.per_hour)
    assert redis.node_cost(3600.0, 0.001) == pytest.approx(redis.per_hour)
    usd = storage_dollars(prices, gets=2.5e6, duration_s=7200.0, graph_gib=1.0, requests=500_000)
    assert usd["s3_standard"] == pytest.approx(1.0)
    assert usd["s3_standard_per_million"] == pytest.approx(2.0)
    assert usd["elasticache_redis"] == pytest.approx(2 * redis.per_hour)
    assert "lambda_x86" not in usd


def test_policy_storage_requests_hand_computed():
    kw = dict(per_fetch=5.0, per_row=0.01, full_download=8, rows_per_request=200.0)
    # gnn_faas: 100 buffer executions aggregating 300 rows per request over 1,000
    # requests: 100·5 + 0.01·300·1000 = 3,500
    g = {
        "requests": 1000,
        "executions": 100,
        "cold_starts": 2,
        "aggregated_rows_per_request": 300.0,
    }
    assert policy_storage_requests("gnn_faas", g, **kw) == pytest.approx(3500.0)
    # request_centric reports no rows: 1,000 fetches of 200 rows: 1000·5 + 0.01·200·1000
    rc = {"requests": 1000, "executions": 1000, "cold_starts": 7}
    assert policy_storage_requests("request_centric", rc, **kw) == pytest.approx(7000.0)
    # dgl_serverless and serverful download the 8 blobs at each start only
    assert policy_storage_requests("dgl_serverless", rc, **kw) == 56.0
    assert policy_storage_requests("serverful", {**rc, "cold_starts": 3}, **kw) == 24.0


def test_bad_storage_price(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("prices:\n  s:\n    kind: storage\n    scheme: s3\n    source: x\n    date: d\n")
    with pytest.raises(InvalidRequest, match="get_per_thousand"):
        load_prices(p)
