"""Lab 01's design part, beam search: the reference, its golden beams, and the tests' power over planted bugs.

The reference (autograder/qa/design/lab01.py) must reproduce the shipped beams (data/golden/lab01_beams.json, and the
hidden twin), clear the screening margins it claims, agree with greedy decoding at beam_width=1 and length_penalty=0,
and give the same beams in float32; transformers' own beam search must return them too.  The planted mistakes the
lab warns about (no length penalty, end-of-text beams extended, a forward pass per beam) must fail the lab's checks
with messages that name the case and the step.  ``python -m autograder.qa.design.lab01_beams --check`` regenerates
the files from scratch (slow: it searches for screened cases); here the stored cases are rerun.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

from autograder import hidden_outputs
from autograder.labs.lab01 import beams as harness
from autograder.qa.design import lab01 as design, lab01_beams as golden
from miniengine.model import load_model
from miniengine.paths import GOLDEN, TARGET


@pytest.fixture(scope="module")
def model64():
    torch.set_num_threads(1)
    return load_model(TARGET, dtype=torch.float64)


@pytest.fixture(scope="module")
def model32():
    return load_model(TARGET)


def files() -> dict[str, dict]:
    return {"visible": json.loads(golden.VISIBLE_FILE.read_text()), "hidden": json.loads(golden.HIDDEN_FILE.read_text())}


def cases(which: str) -> list[dict]:
    return files()[which]["cases"]


def reference(model, case, **change):
    p = {**case["params"], **change}
    return design.beam_search(model, case["prompt_token_ids"], p["beam_width"], p["max_tokens"], p["length_penalty"],
                              p["eos_token_id"])


def ids_of(beams) -> list[list[int]]:
    return [ids for ids, _ in beams]


def own(fn):
    """The harness accepts only functions written in a notebook (__module__ == "__main__")."""
    fn.__module__ = "__main__"
    return fn


@pytest.mark.parametrize("which", ["visible", "hidden"])
def test_the_reference_reproduces_the_shipped_beams_and_their_margins(model64, which):
    assert len(cases(which)) >= 8
    for case in cases(which):
        trace: list = []
        p = case["params"]
        beams = design.beam_search(model64, case["prompt_token_ids"], p["beam_width"], p["max_tokens"],
                                   p["length_penalty"], p["eos_token_id"], trace=trace)
        assert ids_of(beams) == [b["token_ids"] for b in case["beams"]], case["name"]
        assert all(abs(s - b["score"]) <= 1e-8 for (_, s), b in zip(beams, case["beams"])), case["name"]
        step_gap, final_gap, _ = golden.margins(trace, p["beam_width"])
        assert min(step_gap, final_gap) >= golden.GAP, case["name"]
        assert min(len(b["token_ids"]) for b in case["beams"]) >= golden.MIN_TOKENS, case["name"]
        assert case["min_margins"] == {"step_gap": round(step_gap, 6), "final_gap": round(final_gap, 6)}


def test_beam_width_1_without_a_length_penalty_is_greedy_decoding(model64):
    golden_runs = json.loads((GOLDEN / "visible.json").read_text())
    greedy = [c for c in golden_runs["cases"] if c["params"]["temperature"] == 0]
    for case in greedy:
        beams = design.beam_search(model64, case["prompt_token_ids"], 1, case["params"]["max_tokens"], 0.0,
                                   golden_runs["eos_token_id"])
        assert ids_of(beams) == [case["token_ids"]], case["name"]
    # and with a stand-in end-of-text inside the run: greedy stops there, and so does the best beam
    case = greedy[0]
    eos = case["token_ids"][3]
    stop = case["token_ids"].index(eos)
    beams = design.beam_search(model64, case["prompt_token_ids"], 1, case["params"]["max_tokens"], 0.0, eos)
    assert ids_of(beams) == [case["token_ids"][:stop + 1]]


def test_a_float32_search_returns_the_same_beams(model32):
    for which in ("visible", "hidden"):
        for case in cases(which):
            beams = reference(model32, case)
            harness.compare(beams, [(b["token_ids"], b["score"]) for b in case["beams"]],
                            case["params"]["eos_token_id"], case["name"])


def test_transformers_beam_search_returns_the_same_beams():
    transformers = pytest.importorskip("transformers", reason="the optional 'hf' extra (transformers) is not installed")
    hf = transformers.LlamaForCausalLM.from_pretrained(str(TARGET), torch_dtype=torch.float64).eval()
    for case in cases("visible")[:4]:
        p, ids = case["params"], torch.tensor([case["prompt_token_ids"]])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=p["beam_width"],
                          num_return_sequences=p["beam_width"], early_stopping="never",
                          length_penalty=p["length_penalty"], max_new_tokens=p["max_tokens"],
                          eos_token_id=p["eos_token_id"], pad_token_id=p["eos_token_id"], top_k=None, top_p=None,
                          temperature=None, output_scores=True, return_dict_in_generate=True)
        got = []
        for seq in out.sequences[:, ids.shape[1]:].tolist():  # padded after end-of-text
            got.append(seq[:seq.index(p["eos_token_id"]) + 1] if p["eos_token_id"] in seq else seq)
        assert got == [b["token_ids"] for b in case["beams"]], case["name"]
        assert out.sequences_scores.tolist() == pytest.approx([b["score"] for b in case["beams"]], abs=1e-4)


@pytest.mark.slow  # a whole measurement (make quick leaves it out)
@pytest.mark.parametrize("which", ["visible", "hidden"])
def test_each_planted_mistake_changes_the_beams_of_some_case(model64, which):
    unpenalized = [c["name"] for c in cases(which) if ids_of(reference(model64, c, length_penalty=0.0))
                   != [b["token_ids"] for b in c["beams"]]]
    extended = [c["name"] for c in cases(which) if ids_of(reference(model64, c, eos_token_id=-1))
                != [b["token_ids"] for b in c["beams"]]]
    assert len(unpenalized) >= 4 and len(extended) >= 4, (unpenalized, extended)


# The planted mistakes, each the reference with one thing wrong (a student's function: see own()).

def right(model, prompt_ids, beam_width, max_tokens, length_penalty=1.0, eos_token_id=0):
    return design.beam_search(model, prompt_ids, beam_width, max_tokens, length_penalty, eos_token_id)


def no_penalty(model, prompt_ids, beam_width, max_tokens, length_penalty=1.0, eos_token_id=0):
    """The length penalty forgotten altogether: scores are sums, and the ranking follows them."""
    return design.beam_search(model, prompt_ids, beam_width, max_tokens, 0.0, eos_token_id)


def ranked_by_sum(model, prompt_ids, beam_width, max_tokens, length_penalty=1.0, eos_token_id=0):
    """Scores computed right, but the finished hypotheses ranked by their sums."""
    beams = design.beam_search(model, prompt_ids, beam_width, max_tokens, 0.0, eos_token_id)
    return [(ids, s / len(ids) ** length_penalty) for ids, s in beams]


def extends_end_of_text(model, prompt_ids, beam_width, max_tokens, length_penalty=1.0, eos_token_id=0):
    """End-of-text treated as an ordinary token: its beams go on."""
    return design.beam_search(model, prompt_ids, beam_width, max_tokens, length_penalty, -1)


def per_beam(model, prompt_ids, beam_width, max_tokens, length_penalty=1.0, eos_token_id=0):
    """The right beams, but every live beam of a step through a call of its own."""
    def one_at_a_time(ids, positions, backend, logits_indices=None):
        rows, start = [], 0
        for n in backend.seq_lens:
            rows.append(model(ids[start:start + n], positions[start:start + n], type(backend)([n]))[-1])
            start += n
        return torch.stack(rows)

    one_at_a_time.device = model.device
    return design.beam_search(one_at_a_time, prompt_ids, beam_width, max_tokens, length_penalty, eos_token_id)


def baseline():
    """autograder/qa/design/lab01.py's BASELINE (plain greedy decode), defined as the notebook would define it."""
    from miniengine.attention import NoCacheBackend

    scope = {"torch": torch, "NoCacheBackend": NoCacheBackend, "__name__": "__main__"}
    exec(design.BASELINE["design-beam-search"], scope)
    return scope["beam_search"]


def test_the_visible_checks_name_the_case_and_the_step_of_each_planted_mistake():
    with pytest.raises(AssertionError, match=r"^v0-w4 .*beam 0 has the right tokens but the score -3.35[0-9]*, expected -0.838"):
        harness.check_beams(own(no_penalty))
    with pytest.raises(AssertionError, match=r"^v1-w3 .*beam 0 \(best first\) differs at step 3: expected"):
        harness.check_beams(own(ranked_by_sum))
    with pytest.raises(AssertionError, match=r"^v0-w4 .*beam 0 goes on after end-of-text \(id 270, at step 3\)"):
        harness.check_beams(own(extends_end_of_text))
    with pytest.raises(AssertionError, match=r"^v0-w4: [0-9]+ forward passes for max_tokens=12, beam_width=4; at most 12"):
        harness.check_passes(own(per_beam), n_cases=1)
    with pytest.raises(AssertionError, match=r"^v0-w4 .*: 1 beams returned, expected 4"):
        harness.check_beams(baseline())
    harness.check_passes(own(right), n_cases=3)


class Report:
    """HiddenReport's interface, outside a notebook: the cases from the hidden file, the rows as judge() reads them."""

    def __init__(self, data):
        self.data, self.rows = data, []

    def cases(self, file):
        return [{k: c[k] for k in hidden_outputs.INPUT_FIELDS} for c in self.data["cases"]]

    def add(self, file, case, field, value):
        self.rows.append([file, "cases", case["name"], field, value])


def judged(beam_search, cell="design-beams-hidden"):
    data = files()["hidden"]
    report = Report({"cases": hidden_outputs.spec("lab01_naive_decode", cell)[0].cases(data)})
    (harness.report_beams if cell == "design-beams-hidden" else harness.report_passes)(own(beam_search), report)
    return hidden_outputs.judge("lab01_naive_decode", cell, [{"cell": cell, "outputs": report.rows}], {"lab01_beams": data})


@pytest.mark.slow  # a whole measurement (make quick leaves it out)
def test_the_hidden_checks_name_the_case_and_step_without_showing_the_beams():
    assert judged(right) == (True, "")
    assert judged(right, "design-passes-hidden") == (True, "")
    ok, message = judged(ranked_by_sum)
    assert not ok and re.match(r"[0-9] of 9 hidden cases differ from the reference; first: hidden case h1-w3 "
                               r"\(lab01_beams\), beams: beam 0 \(best first\): first difference at step 0", message), message
    ok, message = judged(no_penalty)
    assert not ok and "beam 0 (best first): the right tokens, but the score is off by more than" in message, message
    for case in cases("hidden"):
        assert case["prompt"] not in message and str(case["beams"][0]["token_ids"])[1:-1] not in message
    with pytest.raises(AssertionError, match=r"^hidden case wide0-w6: beam 5 goes on after end-of-text \(id 1135, at step 5\)"):
        judged(extends_end_of_text)
    with pytest.raises(AssertionError, match=r"^hidden case wide0-w6: [0-9]+ forward passes for max_tokens=10, beam_width=6"):
        judged(per_beam, "design-passes-hidden")


def test_bad_arguments_raise_a_value_error_naming_the_field():
    harness.check_beam_arguments(own(right), [(dict(beam_width=0), "beam_width"), (dict(beam_width=True), "beam_width"),
                                              (dict(max_tokens=-1), "max_tokens"),
                                              (dict(length_penalty=float("nan")), "length_penalty")])

    def silent(model, prompt_ids, beam_width, max_tokens, length_penalty=1.0, eos_token_id=0):
        return []

    with pytest.raises(AssertionError, match=r"beam_search\(beam_width=0\) returned without an error"):
        harness.check_beam_arguments(own(silent), [(dict(beam_width=0), "beam_width")])
