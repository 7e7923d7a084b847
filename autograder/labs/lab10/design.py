"""Lab 10's design part, a serving configuration that meets the SLO at the highest rate it can, and the graded
numbers. Reloaded by ``autograder.labs.lab10``.

Your ``serving_config()`` returns the server's budgets and scheduling choices (CONFIG_KEYS below). The harness builds
every trace itself (seeded chat requests: lognormal prompts of 512 tokens on average capped at the 4,096-token context,
outputs of 256 on average, Poisson arrivals, each request carrying a length predictor's noisy guess of sigma 0.5 as in
Lab 04) and replays it on the course's simulator with your configuration, on the course's clock (Llama-3-8B on a paper
H100). It computes each request's TTFT and TPOT from the simulated timelines and the share that met the course's SLO
(miniengine.serving.metrics.SLO: TTFT <= 1 s, TPOT <= 50 ms). Your code returns a configuration and never a number.

The score is DistServe's goodput: the highest rate of the fixed ladder RATES at which the SLO attainment, pooled over
the traces (seeds) of that rate, is at least 90% (``metrics.max_rate_meeting_slo``: the ladder stops at the first rate
that misses). Full points at TARGET_RATE, none at the course's default configuration's (EngineConfig's defaults, FCFS
continuous batching: DEFAULT_RATE), partial credit between. Wall-clock time is shown, never graded.
"""
from __future__ import annotations

import numpy as np

import autograder.notebook_checks as checks
from autograder.notebook_checks.ledger import credit
from miniengine.cost.roofline import GPUS, CostModel, llama3_8b
from miniengine.engine.policy import ContinuousBatching
from miniengine.serving import metrics, simulator as sim

N_REQUESTS, MAX_PROMPT, SIGMA = 300, 4096, 0.5  # requests per trace, the context limit, the predictor's noise
RATES = (10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0, 120.0, 130.0, 140.0, 150.0, 160.0)
ATTAINMENT = 0.9  # the share of requests that must meet the SLO at a rate for the rate to count
# Thresholds, set from the honest configurations measured in autograder/qa/design/lab10.py (visible and hidden seeds).
TARGET_RATE = 80.0
DEFAULT_RATE = 0.0  # the course's default configuration (EngineConfig's defaults, FCFS): misses even 10 requests/s
# What serving_config() may set, and the course's default of each (miniengine.config.EngineConfig, FCFS).
DEFAULTS = {"max_num_seqs": 64, "max_num_batched_tokens": 4096, "enable_chunked_prefill": False,
            "max_chunk_tokens": None, "scheduling_policy": None}
CONFIG_KEYS = tuple(DEFAULTS)
LIMITS = {"max_num_seqs": (1, 1024), "max_num_batched_tokens": (16, 65536), "max_chunk_tokens": (16, 65536)}


def trace(rate: float, seed: int, n: int = N_REQUESTS) -> list:
    """Seeded chat requests at ``rate``/s, prompts capped at MAX_PROMPT, with noisy predicted output lengths."""
    requests = sim.chat_workload(n, rate, seed)
    for r in requests:
        r.prompt_len = min(r.prompt_len, MAX_PROMPT)
        r.timeline.prompt_tokens = r.prompt_len
    return sim.with_predictions(requests, SIGMA, seed)


def _int(config, key, what):
    x = config[key]
    lo, hi = LIMITS[key]
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not lo <= int(x) <= hi:
        raise AssertionError(f"{what}: {key} must be an int in [{lo}, {hi}], got {x!r:.40}")
    return int(x)


def read_config(config, what: str = "serving_config()") -> dict:
    """Your configuration as plain values, every key checked; missing keys take the course's defaults."""
    if not isinstance(config, dict):
        raise AssertionError(f"{what} must return a dict, got {type(config).__name__}")
    unknown = sorted(set(map(str, config)) - set(CONFIG_KEYS))
    assert not unknown, f"{what}: unknown key(s) {unknown}; the keys are {list(CONFIG_KEYS)}"
    out = {**DEFAULTS, **config}
    out["max_num_seqs"] = _int(out, "max_num_seqs", what)
    out["max_num_batched_tokens"] = _int(out, "max_num_batched_tokens", what)
    if not isinstance(out["enable_chunked_prefill"], bool):
        raise AssertionError(f"{what}: enable_chunked_prefill must be True or False, got {out['enable_chunked_prefill']!r:.40}")
    if out["max_chunk_tokens"] is not None:
        out["max_chunk_tokens"] = _int(out, "max_chunk_tokens", what)
        assert out["enable_chunked_prefill"], f"{what}: max_chunk_tokens needs enable_chunked_prefill=True"
    policy = out["scheduling_policy"]
    if policy is not None:
        assert isinstance(policy, type) and policy.__module__ == "__main__", (
            f"{what}: scheduling_policy must be None (the course's FCFS continuous batching) or a class written in this "
            f"notebook (your Lab 04 SLOAwarePolicy, pasted), got {policy!r:.60}")
        assert "admit" in vars(policy), f"{what}: {policy.__name__} must define its own admit(waiting, running, budget)"
    return out


def describe(config: dict) -> str:
    chunk = ("off" if not config["enable_chunked_prefill"] else
             f"chunks of at most {config['max_chunk_tokens']}" if config["max_chunk_tokens"] else "as much as fits")
    policy = config["scheduling_policy"].__name__ if config["scheduling_policy"] is not None else "FCFS"
    return (f"{config['max_num_seqs']} seats, {config['max_num_batched_tokens']} tokens per step, chunked prefill "
            f"{chunk}, {policy}")


def chunk_rule(max_chunk):
    """The scheduler's chunking rule: as much of the prompt as fits, at most max_chunk tokens (None: no cap)."""
    def chunk(seq, tokens_left):
        n = min(seq.num_new_tokens, tokens_left)
        return n if max_chunk is None else min(n, max_chunk)
    return chunk


def serve(config: dict, rate: float, seed: int):
    """One trace through the simulator with ``config`` (read_config's) on the course's clock: the timelines."""
    requests = trace(rate, seed)
    policy = config["scheduling_policy"]() if config["scheduling_policy"] is not None else ContinuousBatching()
    rule = chunk_rule(config["max_chunk_tokens"]) if config["enable_chunked_prefill"] else None
    result = sim.simulate(requests, policy, CostModel(llama3_8b(), GPUS["H100"]), max_num_seqs=config["max_num_seqs"],
                          max_num_batched_tokens=config["max_num_batched_tokens"], chunk_prefill=rule)
    return result.timelines


def attainments(config: dict, seeds, label: str = "") -> list[float]:
    """SLO attainment at each rate of the ladder, pooled over ``seeds``, up to and including the first that misses."""
    out = []
    for rate in RATES:
        met = total = 0
        for seed in seeds:
            what = f"{label}{rate:g} requests/s, seed {seed}"
            try:
                timelines = serve(config, rate, seed)
            except NotImplementedError:
                raise
            except RuntimeError as e:  # the scheduler's rules, or a request never served (a prompt over the budget)
                raise AssertionError(f"{what}, {describe(config)}: {e}") from None
            met += sum(metrics.SLO().met_by(t) for t in timelines)
            total += len(timelines)
        out.append(met / total)
        if out[-1] < ATTAINMENT:
            break
    return out


def max_rate(config: dict, seeds, label: str = "") -> tuple[float, list[float]]:
    att = attainments(config, seeds, label)
    return float(metrics.max_rate_meeting_slo(RATES[:len(att)], att, ATTAINMENT)), att


def check_design(serving_config, seeds, label: str = "") -> float:
    """Your configuration on the ladder: the highest rate meeting the SLO, against TARGET_RATE, partial credit from the
    default configuration's DEFAULT_RATE. Prints the attainment at each rate it served."""
    checks.require_own(serving_config, "serving_config")
    config = read_config(serving_config())
    rate, att = max_rate(config, seeds, label)
    checks.observe(f"{label}highest rate meeting the SLO (attainment >= {ATTAINMENT:.0%}), seeds {list(seeds)}", rate,
                   at_least=TARGET_RATE, baseline=DEFAULT_RATE)
    shown = ", ".join(f"{r:g}/s {a:.1%}" for r, a in zip(RATES, att))
    print(f"{label}{describe(config)}: SLO attainment {shown}")
    print(f"{label}highest rate meeting the SLO: {rate:g} requests/s (target at least {TARGET_RATE:g}; the default "
          f"configuration {DEFAULT_RATE:g}): {credit(rate, at_least=TARGET_RATE, baseline=DEFAULT_RATE):.0%} of this "
          f"test's points")
    return rate


# graded numbers: autograder/labs/shared.py's, re-exported for the cells
from autograder.labs.shared import check_numbers, report_numbers  # noqa: E402, F401
