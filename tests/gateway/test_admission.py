"""Admission control and SLO accounting, on a fake clock (deterministic)."""

from __future__ import annotations

import pytest
from flask import Flask

from gnn_faas.clock import FakeClock
from gnn_faas.gateway.admission import AdmissionController, Overloaded
from gnn_faas.http import install

SLO = 0.3


def controller(**kw) -> tuple[AdmissionController, FakeClock]:
    clock = FakeClock(100.0)
    return AdmissionController(SLO, clock=clock, **kw), clock


def test_a_request_alone_is_admitted_unless_it_already_missed_its_slo():
    ac, clock = controller(initial_limit=1)
    assert ac.decide(clock.now() - 0.29).admit
    ac.done(0.35, 0.29)
    d = ac.decide(clock.now() - 0.31)  # waited past the SLO in the server's queue
    assert not d.admit and d.waited_s == pytest.approx(0.31) and d.retry_after_s >= 1
    assert (ac.admitted, ac.shed) == (1, 1)


def test_concurrency_limit_sheds_the_excess():
    ac, clock = controller(initial_limit=4)
    decisions = [ac.decide(clock.now()) for _ in range(10)]
    assert [d.admit for d in decisions] == [True] * 4 + [False] * 6
    assert ac.in_flight == 4 and ac.shed == 6
    ac.done(0.05)
    assert ac.decide(clock.now()).admit  # one answered: room for one more


def test_good_answers_raise_the_limit_additively_late_ones_cut_it():
    ac, clock = controller(initial_limit=4, headroom=0.7, backoff=0.5)
    for _ in range(4):
        ac.decide(clock.now())
    for _ in range(4):  # four answers within 0.7 * SLO: +1/limit each
        ac.done(0.1)
    assert 4.9 < ac.limit < 5.0
    ac.decide(clock.now())
    ac.decide(clock.now())
    ac.done(0.25)  # later than 0.7 * SLO = 0.21
    assert ac.limit == pytest.approx(0.5 * 4.9, rel=0.03)
    cut = ac.limit
    ac.done(0.25)  # a second late answer within the same SLO period: no second cut
    assert ac.limit == cut
    assert ac.late == 2


def test_queueing_delay_plus_service_time_is_checked_against_the_target():
    ac, clock = controller(initial_limit=16, headroom=0.7)
    ac.decide(clock.now())
    ac.decide(clock.now())
    ac.done(0.15, 0.0)  # service time 0.15 s; one request still in flight
    assert ac.service_s == pytest.approx(0.15)
    assert ac.decide(clock.now() - 0.05).admit  # 0.05 + 0.15 <= 0.21
    d = ac.decide(clock.now() - 0.1)  # 0.1 + 0.15 > 0.21: would likely miss
    assert not d.admit and d.predicted_s == pytest.approx(0.25)


def test_a_few_cold_start_answers_do_not_shed_the_steady_stream():
    ac, clock = controller(window=32)
    for _ in range(30):
        ac.decide(clock.now())
        ac.done(0.08)
    for _ in range(3):  # three answers that waited for instances launching
        ac.decide(clock.now())
        ac.done(1.2)
    assert ac.service_s == pytest.approx(0.08)
    assert ac.decide(clock.now() - 0.05).admit  # 0.05 + 0.08 <= 0.21
    for _ in range(40):  # a queue that really grew: most answers are slow now
        ac.decide(clock.now())
        ac.done(0.4)
    assert ac.service_s == pytest.approx(0.4)
    ac.decide(clock.now())  # one in flight: the next is not alone
    assert not ac.decide(clock.now()).admit


def test_failed_requests_free_their_slot_without_teaching_anything():
    ac, clock = controller(initial_limit=2)
    ac.decide(clock.now())
    limit = ac.limit
    ac.done(None)
    assert ac.in_flight == 0 and ac.limit == limit and ac.service_s == 0.0


def test_disabled_admits_everything():
    ac, clock = controller(initial_limit=1, enabled=False)
    assert all(ac.decide(clock.now() - 10).admit for _ in range(5))


@pytest.mark.parametrize("retry", [1, 3])
def test_overloaded_is_a_503_with_retry_after_and_a_json_body(retry):
    app = install(Flask("t"))

    @app.get("/x")
    def x():
        raise Overloaded("busy", retry)

    resp = app.test_client().get("/x")
    assert resp.status_code == 503
    assert resp.headers["Retry-After"] == str(retry)
    assert resp.get_json() == {"error": "busy"}
