"""Lab 10's design part, a serving configuration on the simulator: honest configurations, the baseline that must fail,
the measurement that set the thresholds in autograder/labs/lab10/design.py, and the generator of the stop-string golden
files (data/golden/lab10_stops.json, autograder/hidden/lab10_stops.json).  Instructor-only
(autograder/qa/design/__init__.py).

    python -m autograder.qa.design.lab10            # every configuration on the visible and the hidden seeds
    python -m autograder.qa.design.lab10 stops      # regenerate the two stop-string files from the golden ones

Every configuration runs through ``design.max_rate``, the harness's own run (the course's simulator, Llama-3-8B on a
paper H100, 300 chat requests per trace with prompts capped at 4,096 tokens and predicted output lengths of noise 0.5,
the rate ladder 10, 20, ..., 160 requests/s, SLO attainment pooled over the seeds of a rate, at least 90%).
Measured 2026-12-04 (highest rate meeting the SLO, requests/s; visible: seeds 0 and 1; hidden: seeds 5 and 6):

    configuration                                                    visible  hidden
    EngineConfig defaults: 64 seats, 4,096 tokens, FCFS (baseline)         0       0
    64 seats, 8,192 tokens                                                30      20
    64 seats, 4,096 tokens, chunked prefill                               30      20
    128 seats, 8,192 tokens                                               70      60
    256 seats, 8,192 tokens                                              110     100
    256 seats, 1,024 tokens, chunked prefill                             120     100
    512 seats, 4,096 tokens, chunks of at most 1,024                     120     110
    256 seats, 2,048 tokens, chunked prefill (the lab's solution)        140     110
    256 seats, 8,192 tokens, Lab 04's SLO-aware policy                   160     120
    256 seats, 2,048 tokens, chunked, Lab 04's SLO-aware policy          160     140

The default misses the SLO already at 10 requests/s (73% attainment on seed 0): a 4,096-token prompt cannot join a
step while decodes hold part of the 4,096-token budget, so it and everyone behind it wait for the batch to drain
(head-of-line blocking), and 64 seats queue the long outputs.  Threshold: 80 requests/s.  Six honest configurations
(seats and a token budget that fits the longest prompt, chunked or not, FCFS or Lab 04's policy) clear it by two
ladder steps or more on both seed sets; 128 seats earn partial credit (60 to 70); the default earns nothing.
"""
from __future__ import annotations

import json
import sys

from autograder.labs.lab10 import design

BASELINE_NAME = "the course's default configuration (EngineConfig's defaults: 64 seats, 4,096 tokens, FCFS)"
BASELINE = {"design-serving": '''\
def serving_config():
    """The course's default configuration: EngineConfig's budgets, no chunked prefill, FCFS continuous batching."""
    return {"max_num_seqs": 64, "max_num_batched_tokens": 4096, "enable_chunked_prefill": False,
            "max_chunk_tokens": None, "scheduling_policy": None}
'''}
MUST_FAIL = ["design-serving-visible", "design-serving-hidden"]
VISIBLE, HIDDEN = (0, 1), (5, 6)


def _lab04_policy():
    from autograder.qa.design.lab04 import Honest

    return Honest("work")


def _c(**kw) -> dict:
    return {**design.DEFAULTS, **kw}


DESIGNS = {
    "EngineConfig defaults: 64 seats, 4,096 tokens, FCFS (baseline)": _c(),
    "64 seats, 8,192 tokens": _c(max_num_batched_tokens=8192),
    "64 seats, 4,096 tokens, chunked prefill": _c(enable_chunked_prefill=True),
    "128 seats, 8,192 tokens": _c(max_num_seqs=128, max_num_batched_tokens=8192),
    "256 seats, 8,192 tokens": _c(max_num_seqs=256, max_num_batched_tokens=8192),
    "256 seats, 1,024 tokens, chunked prefill": _c(max_num_seqs=256, max_num_batched_tokens=1024,
                                                   enable_chunked_prefill=True),
    "512 seats, 4,096 tokens, chunks of at most 1,024": _c(max_num_seqs=512, enable_chunked_prefill=True,
                                                           max_chunk_tokens=1024),
    "256 seats, 2,048 tokens, chunked prefill (the lab's solution)": _c(max_num_seqs=256, max_num_batched_tokens=2048,
                                                                        enable_chunked_prefill=True),
    "256 seats, 8,192 tokens, Lab 04's SLO-aware policy": _c(max_num_seqs=256, max_num_batched_tokens=8192,
                                                            scheduling_policy=_lab04_policy),
    "256 seats, 2,048 tokens, chunked, Lab 04's SLO-aware policy": _c(max_num_seqs=256, max_num_batched_tokens=2048,
                                                                      enable_chunked_prefill=True,
                                                                      scheduling_policy=_lab04_policy),
}


def main() -> None:
    print(f"{'configuration':<64} {'visible':>8} {'hidden':>8}")
    for name, config in DESIGNS.items():
        v, _ = design.max_rate(config, VISIBLE)
        h, _ = design.max_rate(config, HIDDEN)
        print(f"{name:<64} {v:>8g} {h:>8g}", flush=True)


# ---------------------------------------------------------------- the stop-string golden files

# (source file, case name, variant): the golden run the stop strings are cut from.  Variants: "inside" (one stop
# string that ends inside a token), "include" (the same, include_stop_str_in_output), "two" (two stop strings, the
# earlier-ending wins), "never" (a stop string the text never holds: finish_reason "length").
PLAN = [("golden", "p0-greedy", "inside"), ("golden", "p1-temperature", "include"), ("golden", "p2-top_k", "two"),
        ("golden", "p3-top_p", "inside"), ("golden", "p4-combined", "never"), ("golden", "p5-greedy", "two"),
        ("sampling_features", "p6-penalties", "inside"), ("sampling_features", "p7-repetition", "include")]


def _offsets(tok, ids):
    """Where each token's text starts in the decoded text, when every prefix decodes to a prefix of it (else None)."""
    text = tok.decode(ids)
    starts = []
    for k in range(len(ids) + 1):
        head = tok.decode(ids[:k])
        if not text.startswith(head) or "\ufffd" in head:
            return text, None
        starts.append(len(head))
    return text, starts


def _inside(text, starts, first: int):
    """A stop string of 3 characters that ends strictly inside token k (k >= first) and first occurs there."""
    for k in range(first, len(starts) - 1):
        a, b = starts[k], starts[k + 1]
        if b - a < 2 or a < 2:
            continue
        stop = text[a - 2:a + 1]
        if stop.strip() and text.find(stop) == a - 2:
            return stop, k
    raise ValueError("no stop string ends inside a token of this run")


def stop_cases(files: dict) -> list[dict]:
    """The planned cases, their outputs served by the course's engine (LLM), each checked against the rule."""
    from miniengine import LLM, SamplingParams
    from miniengine.tokenizer import load_tokenizer
    from miniengine import paths

    tok = load_tokenizer(paths.TARGET)
    llm = LLM(model=str(paths.TARGET))
    out = []
    for i, (file, name, variant) in enumerate(PLAN):
        case = next(c for c in files[file]["cases"] if c["name"] == name)
        text, starts = _offsets(tok, case["token_ids"])
        assert starts is not None, f"{file}/{name}: a prefix of its tokens does not decode to a prefix of its text"
        params = dict(case["params"])
        params.pop("logprobs", None)
        if variant == "never":
            params["stop"] = ["\x00never"]
        else:
            stop, k = _inside(text, starts, 4 + i % 5)
            params["stop"] = [stop]
            if variant == "include":
                params["include_stop_str_in_output"] = True
            if variant == "two":
                later, _ = _inside(text, starts, k + 3)
                params["stop"] = [later, stop]
        got = llm.generate([case["prompt_token_ids"]], SamplingParams(**params))[0]
        if variant != "never":
            match = min(((text.find(s) + len(s), text.find(s), s) for s in params["stop"] if s in text))
            end, start, _ = match
            want = text[:end] if params.get("include_stop_str_in_output") else text[:start]
            assert got.text == want and got.finish_reason == "stop", (name, got.text, want)
            assert got.token_ids == case["token_ids"][:len(got.token_ids)] and tok.decode(got.token_ids) != got.text
        else:
            assert got.token_ids == case["token_ids"] and got.finish_reason == case["finish_reason"]
        out.append({"name": f"s{i}-{variant}", "prompt": case["prompt"], "prompt_token_ids": case["prompt_token_ids"],
                    "params": params, "token_ids": list(got.token_ids), "text": got.text,
                    "finish_reason": got.finish_reason, "source": f"{file}/{name}"})
    return out


def write_stops() -> None:
    from autograder import hidden_outputs
    from miniengine import paths

    for label, load in (("visible", lambda f: json.load(open(paths.DATA / "golden" / f"{'visible' if f == 'golden' else f}.json"))),
                        ("hidden", hidden_outputs.load)):
        files = {f: load(f) for f in ("golden", "sampling_features")}
        data = {"about": "Stop strings cut from golden runs (autograder/qa/design/lab10.py, stop_cases): one ending "
                         "inside a token, included in the output, two of which the earlier-ending wins, one never met. "
                         "Outputs served by the course's LLM; the golden run's tokens up to the one that completed the "
                         "stop string.",
                "model": files["golden"]["model"], "eos_token_id": files["golden"]["eos_token_id"],
                "cases": stop_cases(files)}
        path = (paths.DATA / "golden" if label == "visible" else hidden_outputs.HIDDEN_DIR) / "lab10_stops.json"
        with open(path, "w") as f:
            json.dump(data, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(f"{label}: {len(data['cases'])} cases -> {path}")


if __name__ == "__main__":
    write_stops() if sys.argv[1:] == ["stops"] else main()
