"""``gnn-faas bench slowclients`` at a small scale against a real ``gnn-faas up``:
idle and slow-body sockets held beyond the gateway's thread count do not stop
normal requests, and the server closes every held socket by itself. The figures
themselves (p99, RSS ratio) are the benchmark's to report, not asserted here."""

from __future__ import annotations

import json

import pytest

from gnn_faas.cli import main

pytestmark = pytest.mark.slow


def test_small_attack_is_survived_and_every_held_socket_closed(tmp_path, capsys):
    code = main(
        [
            "bench", "slowclients", "--store", f"file://{tmp_path / 'store'}",
            "--idle", "40", "--slow", "10", "--threads", "4",
            "--hold-s", "4", "--baseline-s", "2", "--rate", "3",
            "--header-timeout", "1", "--body-timeout", "1",
            "--big-bodies", "4", "--big-mib", "2", "--json",
        ]
    )  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # after prepare's lines
    assert set(out) >= {"baseline", "under_attack", "rss_mib"}
    assert set(out["baseline"]) >= {"p50_ms", "p99_ms", "errors"}
    attack = out["under_attack"]
    assert set(attack) >= {"p50_ms", "p99_ms", "errors", "held", "closed_by_server"}
    # 50 sockets held against 4 threads: every normal request is still answered
    assert attack["requests"] > 0 and attack["errors"] == 0
    # closed sockets were replaced during the hold, and all closed by the server
    assert attack["held"] >= 50 and attack["closed_by_server"] == attack["held"]
    rss = out["rss_mib"]
    assert rss["idle"] > 0 and rss["after_big_bodies"] > 0
    assert sum(rss["statuses"].values()) == 4 and "200" not in rss["statuses"]
