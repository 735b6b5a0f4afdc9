"""Updates in the simulated cost study (``gnn-faas simulate --updates``).

The accounting on hand-made plans (segments read per call, invalidations,
compactions, the writer's requests), and end to end on Bitcoin OTC: every
batch and compaction accounted per policy, and the figures without updates
unchanged by the stream beside them.
"""

from __future__ import annotations

import copy
import io
from contextlib import redirect_stderr

import numpy as np
import pytest

from gnn_faas.cli import main
from gnn_faas.traces.update_cost import UpdatePlan, UpdateReader, update_costs
from gnn_faas.traces.update_stream import update_stream
from tests.traces.test_reference_outputs import run_json, strip_wall


def _plan(times, rows, nbytes, compact_at=(), folded=(), moved=()) -> UpdatePlan:
    n = len(times)
    return UpdatePlan("test", 1.0, 10, np.asarray(times, float), np.full(n, 10),
                      np.asarray(rows), np.asarray(nbytes), base_bytes=10_000, base_gets=5,
                      compact_share=0.25, compact_at=np.asarray(compact_at, float),
                      folded=np.asarray(folded, np.int64),
                      compact_bytes=np.asarray(moved, float))  # fmt: skip


def test_a_reader_reads_each_segment_once_and_drops_its_rows():
    plan = _plan([10, 20, 30, 40], rows=[1, 2, 4, 8], nbytes=[100, 200, 400, 800])
    r = UpdateReader(plan)
    r.call("a", 5)  # before any batch: nothing to read, a cache from now on
    r.call("a", 25)  # batches 0, 1: read and their rows dropped
    r.call("a", 26)  # nothing new
    r.call("b", 35)  # a new instance: reads the log (0, 1, 2), has no cache to drop from
    r.call("a", 45)  # batches 2, 3
    assert r.figures() == {"segment_gets": 2 + 3 + 2, "segment_bytes": 300 + 700 + 1200,
                           "rows_invalidated": 3 + 12}  # fmt: skip


def test_a_compaction_folds_the_log_into_the_base():
    plan = _plan([10, 20, 30, 40], rows=[1, 2, 4, 8], nbytes=[100, 200, 400, 800],
                 compact_at=[20], folded=[2], moved=[1000])  # fmt: skip
    r = UpdateReader(plan)
    r.call("a", 15)  # the log: batch 0
    r.call("a", 35)  # batch 1 was folded at 20 (it comes with the base): batch 2 only
    r.call("b", 45)  # a new instance after the compaction: the log since it (2, 3)
    assert r.figures() == {"segment_gets": 1 + 1 + 2, "segment_bytes": 100 + 400 + 1200,
                           "rows_invalidated": 4}  # fmt: skip
    holder = UpdateReader(plan, holds_graph=True)
    holder.call("a", 15)
    holder.call("a", 35)
    assert holder.figures()["rows_invalidated"] == 0  # applied in place, nothing dropped


def test_the_writer_and_the_compactions_are_billed():
    plan = _plan([10, 20, 30], rows=[1, 1, 1], nbytes=[2**20] * 3,
                 compact_at=[20], folded=[2], moved=[3 * 2**20])  # fmt: skip
    reads = {"segment_gets": 4, "segment_bytes": 2 * 2**20, "rows_invalidated": 10}
    from gnn_faas.traces.cost import load_prices

    prices = load_prices()
    got = update_costs("gnn_faas", reads, plan, reader_mb=512, reader_vcpus=1, graph_mb=2048,
                       bandwidth_mb_s=1.0, row_bytes=2**20 / 10, per_row_gets=0.5,
                       prices=prices, requests=100)  # fmt: skip
    assert got["store_puts"] == 2 * 3 + 1 * (5 + 1)  # segment + record each; base blobs + pointer
    assert got["store_gets"] == 4 + 0.5 * 10 + 5 + 2  # segments, re-reads, base, folded log
    assert got["compaction_s"] == pytest.approx(3.0)  # 3 MiB at 1 MiB/s
    assert got["reader_busy_s"] == pytest.approx(2.0 + 1.0)  # segments and rows re-read
    assert got["gb_s"] == pytest.approx(3.0 * 0.5 + 3.0 * 2.0)
    s3 = prices["s3_standard"]
    assert got["dollars"]["s3_standard"] == pytest.approx(
        s3.request_cost(got["store_gets"], got["store_puts"])
    )
    lam = prices["lambda_x86"]
    assert got["dollars"]["lambda_x86"] == pytest.approx(got["gb_s"] * lam.gb_s)
    held = update_costs("serverful", reads, plan, reader_mb=512, reader_vcpus=1, graph_mb=2048,
                        bandwidth_mb_s=1.0, row_bytes=2**20 / 10, per_row_gets=0.5,
                        prices=prices, requests=100)  # fmt: skip
    assert held["rows_invalidated"] == 0 and held["rows_reread_gets"] == 0


WINDOW = ["simulate", "twitter", "--minutes", "4", "--start-minute", "450", "--warmup", "30",
          "--policies", "all", "--json", "--no-progress"]  # fmt: skip


@pytest.fixture(scope="module")
def with_and_without(bitcoin_store):
    plain = run_json(WINDOW, bitcoin_store)
    updated = run_json([*WINDOW, "--updates", "higgs-activity", "--update-rate", "2000",
                        "--update-batch", "500"], bitcoin_store)  # fmt: skip
    return plain, updated


def test_updates_leave_every_other_figure_as_it_was(with_and_without):
    plain, updated = copy.deepcopy(with_and_without)
    stream = updated.pop("updates")
    for s in updated["policies"].values():
        s.pop("updates")
    assert strip_wall(updated) == strip_wall(plain)
    assert stream["stream"] == "higgs-activity" and stream["batch"] == 500


def test_every_batch_and_compaction_is_accounted_per_policy(with_and_without, bitcoin_graph):
    _, updated = with_and_without
    stream = updated["updates"]
    # the batches due in the measured 240 s (after a 30 s warm-up): every 500th edge at 2,000/s
    times = update_stream("higgs-activity", bitcoin_graph).scaled(2000).times
    assert stream["batches"] == int(np.searchsorted(times[499::500], 240.0)) > 10
    assert stream["edges"] == 500 * stream["batches"]
    assert stream["compactions"] >= 1  # the log passed a quarter of the base
    assert stream["first_s"] >= 30.0 and stream["last_s"] < 270.0  # the measured window
    for name, s in updated["policies"].items():
        u = s["updates"]
        assert u["batches"] == u["segment_puts"] == u["record_puts"] == stream["batches"]
        assert u["compactions"] == stream["compactions"] and u["compaction_s"] > 0
        assert u["store_puts"] > 2 * u["batches"]  # the compactions' base blobs too
        assert u["segment_gets"] > 0 and u["segment_bytes_read"] > 0
        assert u["gb_s"] > 0 and u["dollars"]["s3_standard"] > 0
        if name in ("dgl_serverless", "serverful"):
            assert u["rows_invalidated"] == 0
        else:
            assert u["rows_invalidated"] > 0
    # gnn_faas reads through fewer memory instances than request-centric's pairs
    p = updated["policies"]
    assert (
        p["gnn_faas"]["updates"]["segment_gets"] < p["request_centric"]["updates"]["segment_gets"]
    )


@pytest.mark.parametrize("flag", [["--update-rate", "0"], ["--update-batch", "0"], ["--frontier"]])
def test_bad_update_flags_are_a_one_line_error(bitcoin_store, flag):
    err = io.StringIO()
    with redirect_stderr(err):
        code = main([*WINDOW, "--updates", "bitcoin-otc-time", *flag, "--store", bitcoin_store])
    assert code != 0
    assert "--update" in err.getvalue() and "Traceback" not in err.getvalue()
    assert len(err.getvalue().strip().splitlines()) == 1


def test_update_stream_names_are_checked():
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as exc:
        main([*WINDOW, "--updates", "nope"])
    assert exc.value.code == 2 and "invalid choice" in err.getvalue()
