"""Simulation jobs in forked processes: results in order, one progress bar
over every job's requests, failures raised in the parent; a simulation on two
processes reports what it reports on one."""

from __future__ import annotations

import json

import pytest

from gnn_faas.errors import InvalidRequest
from gnn_faas.traces.parallel import Job, run_jobs
from tests.traces.test_reference_outputs import RUNS, run_json, strip_wall


class Bar:
    def __init__(self):
        self.n = 0

    def update(self, k: int) -> None:
        assert k > 0
        self.n += k


def counting_job(name: str, size: int) -> Job:
    def run(progress):
        for i in range(0, size + 1, max(size // 10, 1)):
            progress(i)
        return {"name": name, "squares": [k * k for k in range(size % 7)]}

    return Job(name, run, size)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_jobs_come_back_in_order_with_the_bar_at_the_total(workers):
    jobs = [counting_job(f"j{k}", 1000 * (k + 1)) for k in range(5)]
    bar = Bar()
    out = run_jobs(jobs, workers, bar)
    assert [r["name"] for r in out] == [j.name for j in jobs]
    assert out[2]["squares"] == [k * k for k in range(3000 % 7)]
    assert bar.n == sum(j.size for j in jobs)


def test_a_failing_job_fails_the_run_with_its_error():
    def bad_request(progress):
        raise InvalidRequest("no arrivals in that window")

    def crash(progress):
        raise ZeroDivisionError("boom")

    with pytest.raises(InvalidRequest, match="no arrivals in that window"):
        run_jobs([counting_job("a", 10), Job("b", bad_request, 10)], 2)
    with pytest.raises(RuntimeError, match="ZeroDivisionError: boom"):
        run_jobs([Job("c", crash, 10), counting_job("d", 10)], 2)


def test_results_cross_as_json_not_pickle():
    """A job's result must be JSON: anything else fails in the child."""

    def unjsonable(progress):
        return {"x": {1, 2}}

    with pytest.raises(RuntimeError, match="not JSON serializable"):
        run_jobs([Job("e", unjsonable, 1), counting_job("f", 1)], 2)


def test_two_processes_report_what_one_does(bitcoin_store):
    argv = RUNS["twitter_cost"]
    one = strip_wall(run_json([*argv, "--workers", "1"], bitcoin_store))
    two = strip_wall(run_json([*argv, "--workers", "2"], bitcoin_store))
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)
