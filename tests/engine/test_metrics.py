"""Serving metrics from timestamps.

Definitions follow miniengine/README.md, section "Serving metrics" (goodput's second definition is
DistServe's: Zhong et al., OSDI 2024, https://arxiv.org/abs/2401.09670); the timelines below are
small enough to check by hand.
"""
import math

import numpy as np
import pytest

from miniengine.serving import metrics
from miniengine.serving.metrics import SLO, RequestTimeline

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


def timeline(arrival, times, prompt=10, **kw):
    return RequestTimeline(arrival, prompt, list(times), **kw)


def test_latencies_of_one_request():
    # Arrives at 1.0, first token at 1.5, then 4 more tokens 0.1 s apart, finishing at 1.9.
    r = timeline(1.0, [1.5, 1.6, 1.7, 1.8, 1.9], scheduled=1.2)
    assert metrics.ttft(r) == pytest.approx(0.5)
    assert metrics.tpot(r) == pytest.approx(0.1)  # (finish - first token) / (L_o - 1)
    assert metrics.itl(r) == pytest.approx([0.1] * 4)
    assert metrics.e2e(r) == pytest.approx(0.9)
    assert metrics.queueing_delay(r) == pytest.approx(0.2)
    # Serving metrics: E2E = TTFT + (L_o - 1) x TPOT, and TPOT is the mean ITL.
    assert metrics.e2e(r) == pytest.approx(metrics.ttft(r) + 4 * metrics.tpot(r))
    assert metrics.tpot(r) == pytest.approx(np.mean(metrics.itl(r)))


def test_explicit_finish_after_the_last_token():
    r = timeline(0.0, [0.2, 0.3], finish=0.5)  # e.g. detokenizing and closing the stream take time
    assert metrics.e2e(r) == pytest.approx(0.5)


def test_uneven_gaps_show_in_itl_not_in_tpot():
    r = timeline(0.0, [1.0, 1.01, 1.02, 2.0])  # a stall before the last token (another request's prefill)
    assert metrics.tpot(r) == pytest.approx(1.0 / 3)
    assert metrics.itl(r).max() == pytest.approx(0.98)


def test_one_token_reply_has_no_tpot_and_still_can_meet_the_slo():
    r = timeline(0.0, [0.3])
    assert math.isnan(metrics.tpot(r))
    assert SLO(ttft_s=1.0, tpot_s=0.05).met_by(r)


def test_slo_is_per_request_on_ttft_and_tpot():
    # Serving metrics: the SLO is per request: is this request's TTFT <= 1 s and TPOT <= 50 ms?
    slo = SLO(ttft_s=1.0, tpot_s=0.05)
    assert slo.met_by(timeline(0.0, [0.9, 0.94, 0.98]))
    assert not slo.met_by(timeline(0.0, [1.1, 1.12]))  # first token too late
    assert not slo.met_by(timeline(0.0, [0.1, 0.2, 0.3]))  # 100 ms per token: too slow a stream


def test_throughput_goodput_and_attainment():
    slo = SLO(1.0, 0.05)
    runs = [
        timeline(0.0, [0.5, 0.52, 0.54]),  # good, 3 tokens
        timeline(1.0, [1.2, 1.24]),  # good, 2 tokens
        timeline(2.0, [4.0, 4.01, 4.02, 4.03]),  # TTFT 2 s: bad, 4 tokens
        timeline(3.0, [3.5, 3.7, 3.9, 4.1, 10.0]),  # TPOT 1.625 s: bad, 5 tokens
    ]
    span = 10.0  # first arrival 0.0 to last finish 10.0
    assert metrics.duration(runs) == span
    assert metrics.throughput(runs) == pytest.approx(14 / span)
    assert metrics.request_throughput(runs) == pytest.approx(4 / span)
    assert metrics.slo_attainment(runs, slo) == pytest.approx(0.5)
    # Serving metrics, goodput definition 1: requests per second that met the SLO ...
    assert metrics.goodput(runs, slo) == pytest.approx(2 / span)
    # ... and the tokens of those requests per second.
    assert metrics.goodput_tokens(runs, slo) == pytest.approx(5 / span)
    s = metrics.summarize(runs, slo)
    assert s["goodput_req_s"] == pytest.approx(0.2) and s["ttft_p50_s"] == pytest.approx(0.5)
    assert s["throughput_tok_s"] == pytest.approx(1.4)


def test_goodput_as_the_highest_rate_meeting_a_target():
    # Serving metrics, goodput definition 2 (DistServe): the highest arrival rate whose SLO attainment is >= 90%.
    rates = [0.05, 0.1, 0.2, 0.4, 0.8]
    assert metrics.max_rate_meeting_slo(rates, [0.99, 0.95, 0.91, 0.7, 0.95]) == 0.2  # stops at the first miss
    assert metrics.max_rate_meeting_slo(rates, [0.8] * 5) == 0.0
    assert metrics.max_rate_meeting_slo(rates, [0.99] * 5, target=0.99) == 0.8


def test_percentiles_are_numpys():
    # numpy's default (linear) percentile of 1..100: P50 = 50.5, P90 = 90.1, P99 = 99.01.
    p = metrics.percentiles(range(1, 101))
    assert p == pytest.approx({"p50": 50.5, "p90": 90.1, "p99": 99.01})
    assert metrics.percentiles([1.0, math.nan, 3.0], qs=(50,)) == {"p50": 2.0}
    assert math.isnan(metrics.percentiles([])["p99"])


def test_tail_fanout():
    # Serving metrics, tail fan-out (Dean and Barroso, "The Tail at Scale", CACM 2013): 20 calls, each 1%
    # likely to exceed its P99: 1 - 0.99^20 = 18.2%.
    assert metrics.fanout_tail_probability(20, 0.01) == pytest.approx(0.182, rel=0.01)
    # To keep that at 10%, each call may exceed its target with probability 0.525%
    # (design each call for about P99.5).
    q = metrics.per_call_tail_budget(20, 0.10)
    assert q == pytest.approx(0.00525, rel=0.01)
    assert metrics.fanout_tail_probability(20, q) == pytest.approx(0.10)


def test_cost_per_million_tokens():
    # $3.60/hour is $0.001/s; at 1 token/s a million tokens take 1e6 s.  (The batch-1 server's price,
    # worked example "Serving one at a time" in miniengine/README.md, is checked against the simulator
    # in test_sim.)
    assert metrics.cost_per_million_tokens(3.6, 1.0) == pytest.approx(1000.0)
    assert metrics.cost_per_million_tokens(3.6, 1000.0) == pytest.approx(1.0)


def test_timeline_guards():
    r = RequestTimeline(arrival=0.0, request_id="r1")
    with pytest.raises(ValueError, match="r1"):
        metrics.ttft(r)
    r.record_token(0.5)
    with pytest.raises(ValueError, match="decrease"):
        r.record_token(0.4)
    with pytest.raises(ValueError):
        metrics.throughput([])
