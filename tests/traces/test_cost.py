"""Cost arithmetic against hand-computed cases, and the price file's checks."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest
from gnn_faas.traces.cost import dollars, load_prices


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
