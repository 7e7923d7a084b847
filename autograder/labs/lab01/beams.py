"""Lab 01's tests of Task 7, beam search (the design part): what each of its test cells checks.

design-args-visible: a bad beam_width, max_tokens or length_penalty raises ValueError naming the field.
design-beams-visible: hand-made cases on a bigram model (the lab's worked example, ties, a stand-in end-of-text),
  then beam_width=1 with length_penalty=0 against the visible greedy golden runs, then every case of
  data/golden/lab01_beams.json: the beams' token ids, their order, and their scores within SCORE_TOLERANCE.
design-beams-hidden: the same on hidden prompts; your beams go into the report and the grader compares them.
design-passes-visible / -hidden: the model is wrapped in a counter; the beams must be right and the forward
  passes at most max_tokens (one batched pass per step for all live beams; a loop over the beams makes up to
  beam_width times as many).
The golden beams come from a float64 reference on prompts screened so that no cut the search makes is within
1e-3 of a tie: a correct float32 implementation returns exactly these beams.

Part of the lab01 harness: autograder/labs/lab01/__init__.py reloads this module and hands its functions to the test cells.
"""
from __future__ import annotations

import json
import math
import numbers
import types

import numpy as np
import torch

from autograder import notebook_checks as checks
from autograder.labs.lab01.decode import visible_golden
from autograder.labs.shared import first_difference

BEAMS = "lab01_beams"  # data/golden/lab01_beams.json; the hidden cases' twin stays with the grader
SCORE_TOLERANCE = 1e-4  # float32 against the float64 reference moves a score by about 1e-5


def visible_beams() -> dict:
    with open(checks.VISIBLE_GOLDEN.parent / f"{BEAMS}.json") as f:
        return json.load(f)


class BigramModel:
    """A stand-in for the model in hand-made cases: the next token's probabilities depend on the last token only.

    Called as the real model is, ``model(input_ids, positions, backend, logits_indices=None)``, with one row per
    input token (or per index); its logits are log(probabilities), so log_softmax gives them back."""

    def __init__(self, probs):
        self.table = torch.log(torch.tensor(probs, dtype=torch.float64))
        self.device, self.dtype = torch.device("cpu"), torch.float64
        self.config = types.SimpleNamespace(vocab_size=len(probs), eos_token_id=0)

    def __call__(self, input_ids, positions, backend, logits_indices=None):
        rows = self.table[torch.as_tensor(input_ids).long()]
        return rows if logits_indices is None else rows[torch.as_tensor(logits_indices).long()]

    forward = __call__


def as_score(x, what: str) -> float:
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        x = x.item()
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise AssertionError(f"{what}: expected a score (a float), got {type(x).__name__} {x!r:.60}")
    return float(x)


def as_beams(out, what: str) -> list[tuple[list[int], float]]:
    """Your result as plain (token ids, score) pairs, before anything is compared."""
    if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__iter__"):
        raise AssertionError(f"{what}: expected a list of (token_ids, score) pairs, got {type(out).__name__}")
    beams = []
    for i, item in enumerate(list(out)):
        try:
            ids, score = item
        except (TypeError, ValueError):
            raise AssertionError(f"{what}: item {i} should be a (token_ids, score) pair, got {type(item).__name__}") from None
        beams.append((checks.as_tokens(ids, f"{what}: beam {i}'s token ids"), as_score(score, f"{what}: beam {i}'s score")))
    return beams


def run(beam_search, model, prompt, params: dict, what: str) -> list[tuple[list[int], float]]:
    beams = as_beams(beam_search(model, list(prompt), params["beam_width"], params["max_tokens"],
                                 length_penalty=params["length_penalty"], eos_token_id=params["eos_token_id"]), what)
    if len(prompt) > 1 and beams and all(ids[:len(prompt)] == list(prompt) for ids, _ in beams):
        raise AssertionError(f"{what}: every beam starts with the prompt; token_ids are the generated tokens only")
    seen = {}
    for i, (ids, _) in enumerate(beams):
        if tuple(ids) in seen:
            raise AssertionError(f"{what}: beams {seen[tuple(ids)]} and {i} are the same hypothesis; the search starts "
                                 f"from one live beam (the prompt alone), and every candidate has one parent")
        seen[tuple(ids)] = i
    return beams


def past_end(beams, eos: int, what: str) -> None:
    """No beam may go on after an end-of-text token: an end-of-text candidate finishes its hypothesis."""
    for i, (ids, _) in enumerate(beams):
        if eos in ids[:-1]:
            raise AssertionError(f"{what}: beam {i} goes on after end-of-text (id {eos}, at step {ids.index(eos)}); "
                                 f"an end-of-text candidate among the first beam_width finishes its hypothesis")


def compare(got, want, eos: int, what: str, show=str, hidden=False) -> None:
    """got and want as (ids, score) pairs, best first: the message says which beam, which step, and why (and for
    a hidden case, nothing of what was expected)."""
    past_end(got, eos, what)
    assert len(got) == len(want), f"{what}: {len(got)} beams returned, expected {len(want)} (beam_width of them)"
    ids_got, ids_want = [g for g, _ in got], [w for w, _ in want]
    if ids_got != ids_want and sorted(ids_got) == sorted(ids_want):
        raise AssertionError(f"{what}: the right {len(want)} hypotheses in the wrong order, got scores "
                             f"{[round(s, 4) for _, s in got]}; rank the finished hypotheses by score = "
                             f"sum / len**length_penalty, best first")
    for i, ((g, gs), (w, ws)) in enumerate(zip(got, want)):
        if g != w:
            t = first_difference(g, w)
            raise AssertionError(f"{what}: beam {i} (best first) differs at step {t}" + ("" if hidden else
                                 f": expected {show(w)} (score {ws:.6f}), got {show(g)} (score {gs:.6f})"))
        assert math.isfinite(gs) and abs(gs - ws) <= SCORE_TOLERANCE * max(1.0, abs(ws)), (
            f"{what}: beam {i} has the right tokens but the score {gs:.6f}" + ("" if hidden else f", expected {ws:.6f}")
            + f": the sum of the log-probabilities of its {len(w)} generated tokens (end-of-text included) / "
              f"{len(w)}**length_penalty")


def observe_beams(label: str, got, want=None) -> None:
    """The beams for the grader: token ids exactly, scores within SCORE_TOLERANCE (absolute, or relative past 1)."""
    checks.observe(label, [[ids, score] for ids, score in got], tol=SCORE_TOLERANCE, rel=SCORE_TOLERANCE,
                   **({"expect": [[list(ids), float(s)] for ids, s in want]} if want else {}))


# ---------------------------------------------------------------- design-args-visible

def check_beam_arguments(beam_search, cases) -> None:
    """cases: (keyword arguments that are wrong, the field the ValueError must name)."""
    checks.require_own(beam_search, "beam_search")
    model = BigramModel([[0.25] * 4] * 4)
    for bad, field in cases:
        kwargs = {**dict(beam_width=2, max_tokens=3, length_penalty=1.0, eos_token_id=0), **bad}
        call = "beam_search(" + ", ".join(f"{k}={v!r}" for k, v in bad.items()) + ")"
        try:
            beam_search(model, [1], **kwargs)
        except ValueError as e:
            assert field in str(e), f"{call} raised ValueError({str(e)!r}), which should name the field {field!r}"
            checks.observe(f"{call}: raises ValueError naming {field!r}", True, expect=True)
            continue
        except NotImplementedError:
            raise  # the unwritten stub: an error, not a wrong answer
        except Exception as e:
            raise AssertionError(f"{call} should raise ValueError naming {field!r} and its allowed range, "
                                 f"got {type(e).__name__}: {e}") from None
        raise AssertionError(f"{call} returned without an error; it should raise ValueError naming {field!r}")


# ---------------------------------------------------------------- design-beams-visible / -hidden

def check_beams_bigram(beam_search, cases, hidden=False) -> None:
    """Hand-made cases: (probability table, prompt, params, expected [(token ids, score)] best first)."""
    checks.require_own(beam_search, "beam_search")
    with checks.reference_forbidden("beam_search"):
        for k, (table, prompt, params, *want) in enumerate(cases):
            what = (f"hidden hand-made case {k}" if hidden else f"hand-made case {k} (prompt {prompt}, {params})")
            got = run(beam_search, BigramModel(table), prompt, params, what)
            if want:  # a hidden case comes without its beams: they stay with the grader
                want = [[list(w), float(s)] for w, s in want[0]]
                compare(got, want, params["eos_token_id"], what, hidden=hidden)
            past_end(got, params["eos_token_id"], what)
            observe_beams(f"{what}: beams", got, want)


def check_beams_greedy(beam_search, n_cases, max_tokens) -> None:
    """beam_width=1 with length_penalty=0 is greedy decoding: the first max_tokens tokens of the first n_cases
    visible greedy golden runs."""
    checks.require_own(beam_search, "beam_search")
    with checks.reference_forbidden("beam_search"):
        golden, model32, tok = visible_golden(), checks.load_model(), checks.load_tokenizer()
        for case in [c for c in golden["cases"] if c["params"]["temperature"] == 0][:n_cases]:
            n = min(max_tokens, case["params"]["max_tokens"])
            params = dict(beam_width=1, max_tokens=n, length_penalty=0.0, eos_token_id=golden["eos_token_id"])
            what = f"{case['name']} with beam_width=1, length_penalty=0 (greedy decoding)"
            got = run(beam_search, model32, case["prompt_token_ids"], params, what)
            assert len(got) == 1, f"{what}: {len(got)} beams returned, expected 1"
            want = case["token_ids"][:n]
            assert got[0][0] == want, (f"{what}: differs from the golden greedy run at step "
                                       f"{first_difference(got[0][0], want)}: expected {tok.decode(want)!r}, "
                                       f"got {tok.decode(got[0][0])!r}")
            checks.observe(f"{what}: token_ids", got[0][0], expect=want)


def check_beams(beam_search, n_cases=None) -> int:
    """The first n_cases (all by default) visible golden beam cases, on the float32 model. Returns how many."""
    checks.require_own(beam_search, "beam_search")
    with checks.reference_forbidden("beam_search"):
        cases = visible_beams()["cases"][:n_cases]
        model32, tok = checks.load_model(), checks.load_tokenizer()
        for case in cases:
            what = f"{case['name']} (prompt {case['prompt']!r}, {case['params']}, end-of-text {case['eos_text']!r})"
            got = run(beam_search, model32, case["prompt_token_ids"], case["params"], what)
            want = [(b["token_ids"], b["score"]) for b in case["beams"]]
            compare(got, want, case["params"]["eos_token_id"], what, show=lambda ids: repr(tok.decode(ids)))
            observe_beams(f"{case['name']}: beams", got, want)
    return len(cases)


def report_beams(beam_search, report) -> None:
    """Hidden: your beams on every hidden case go into the report (properties that need no golden data are checked
    here: no beam goes on past end-of-text, beam_width beams)."""
    checks.require_own(beam_search, "beam_search")
    with checks.reference_forbidden("beam_search"):
        model = checks.load_model()
        for case in report.cases(BEAMS):
            what = f"hidden case {case['name']}"
            got = run(beam_search, model, case["prompt_token_ids"], case["params"], what)
            past_end(got, case["params"]["eos_token_id"], what)
            assert len(got) == case["params"]["beam_width"], (
                f"{what}: {len(got)} beams returned, expected beam_width = {case['params']['beam_width']}")
            report.add(BEAMS, case, "beams", [[ids, score] for ids, score in got])


# ---------------------------------------------------------------- design-passes-visible / -hidden

def check_pass_count(calls, params: dict, what: str) -> None:
    n, limit = len(calls), params["max_tokens"]
    checks.observe(f"{what}: forward passes (beam_width={params['beam_width']}, max_tokens={limit})", n, at_most=limit)
    per_call = sorted({len(c["seq_lens"]) or 1 for c in calls})
    assert n <= limit, (f"{what}: {n} forward passes for max_tokens={limit}, beam_width={params['beam_width']}; at most "
                        f"{limit}: one pass per step for all live beams together (sequences per pass: {per_call}). "
                        f"NoCacheBackend(seq_lens) takes the beams laid end to end as one ragged batch")


def check_passes(beam_search, n_cases) -> int:
    """The first n_cases visible beam cases through a model that counts its calls. Returns how many."""
    checks.require_own(beam_search, "beam_search")
    with checks.reference_forbidden("beam_search"):
        cases = visible_beams()["cases"][:n_cases]
        model32 = checks.load_model()
        for case in cases:
            with checks.RecordingModel(model32) as recorder:
                got = run(beam_search, recorder, case["prompt_token_ids"], case["params"], case["name"])
            want = [(b["token_ids"], b["score"]) for b in case["beams"]]
            assert [g for g, _ in got] == [w for w, _ in want], (
                f"{case['name']}: the beams differ from the golden ones; pass the visible beams tests first")
            check_pass_count(recorder.calls, case["params"], case["name"])
    return len(cases)


def report_passes(beam_search, report) -> None:
    """Hidden: every hidden case through a model that counts its calls; your beams go into the report."""
    checks.require_own(beam_search, "beam_search")
    with checks.reference_forbidden("beam_search"):
        model32 = checks.load_model()
        for case in report.cases(BEAMS):
            what = f"hidden case {case['name']}"
            with checks.RecordingModel(model32) as recorder:
                got = run(beam_search, recorder, case["prompt_token_ids"], case["params"], what)
            check_pass_count(recorder.calls, case["params"], what)
            report.add(BEAMS, case, "beams", [[ids, score] for ids, score in got])
