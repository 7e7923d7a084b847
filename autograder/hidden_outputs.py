"""What each hidden test reports, and how the grader compares it with the hidden golden outputs.

The hidden golden files (autograder/hidden/*.json) hold prompts (inputs) and the
reference's outputs.  A student's kernel may see the inputs while it is graded,
but never the outputs: in the sandbox it gets only ``public_view`` of each file.
A hidden test cell runs the student's code on those inputs and reports what came
out (``notebook_checks.HiddenReport``); the trusted grading worker, outside the
sandbox, compares the report with the real file (``judge``).  Its messages name
the case and the step, never an expected token.

``SPECS`` says, for every hidden test cell that needs golden outputs, which cases
of which file it must report and which fields.  The kernel picks its cases from
the same table, so the cell and the grader cannot disagree about what is due.
This module holds no data and imports nothing heavy: the kernel imports it too.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

MIME = "application/vnd.miniengine.hidden-outputs+json"
FILES = ("golden", "int8", "int4", "gqa2", "gqa2_pooled", "kv_text", "lab01_search", "sampling_features", "lab10_stops")
HIDDEN_DIR = Path(__file__).resolve().parent / "hidden"
CASES_ENV = "AUTOGRADER_HIDDEN_CASES"  # the folder of public views inside the sandbox

INPUT_FIELDS = ("name", "prompt", "prompt_token_ids", "params")  # what a case may show a student's code
TOP_FIELDS = ("about", "model", "eos_token_id", "quantization")  # file-level facts that are inputs too
SECTIONS = ("cases", "fork_cases")
OUTPUT_FIELDS = ("token_ids", "tokens_processed", "chosen_logits", "completions", "text")  # what a test may report
LOGIT_TOLERANCE = 1e-4


def public_view(data: dict) -> dict:
    """A hidden file with every output removed: prompts, parameters and the end-of-text id only."""
    view = {k: data[k] for k in TOP_FIELDS if k in data}
    for section in SECTIONS:
        if section in data:
            view[section] = [{k: c[k] for k in INPUT_FIELDS if k in c} for c in data[section]]
    return view


# ------------------------------------------------------------------ which cases each hidden cell reports

def _kind(case: dict) -> str:
    return case["name"].split("-", 1)[1]


def one_per_kind(cases: list[dict]) -> list[dict]:
    """One case of each sampler kind (greedy, temperature, top_k, ...), each from a different prompt where possible."""
    chosen: dict[str, dict] = {}
    used: set[str] = set()
    for fresh_prompts_only in (True, False):
        for case in cases:
            if _kind(case) in chosen or (fresh_prompts_only and case["prompt"] in used):
                continue
            chosen[_kind(case)] = case
            used.add(case["prompt"])
    return sorted(chosen.values(), key=cases.index)


def two_per_kind(cases: list[dict]) -> list[dict]:
    first = one_per_kind(cases)
    return first + one_per_kind([c for c in cases if c not in first])


def three_per_kind(cases: list[dict]) -> list[dict]:
    first = two_per_kind(cases)
    return first + one_per_kind([c for c in cases if c not in first])


SELECTORS = {
    "all": lambda cases: list(cases),
    "greedy": lambda cases: [c for c in cases if c["params"]["temperature"] == 0],
    "sampled": lambda cases: [c for c in cases if c["params"]["temperature"] != 0],
    "one_per_kind": one_per_kind,
    "two_per_kind": two_per_kind,
    "first_six": lambda cases: list(cases[:6]),
    "three_per_kind": three_per_kind,
    "first_two": lambda cases: list(cases[:2]),
    "last_one": lambda cases: list(cases[-1:]),
}


class Due:
    """One line of a spec: report ``fields`` for the cases ``selector`` picks from ``file``'s ``section``."""

    def __init__(self, file: str, selector: str, fields: tuple[str, ...], section: str = "cases"):
        assert file in FILES and selector in SELECTORS and section in SECTIONS
        assert all(f in OUTPUT_FIELDS for f in fields)
        self.file, self.selector, self.fields, self.section = file, selector, tuple(fields), section

    def cases(self, data: dict) -> list[dict]:
        return SELECTORS[self.selector](data[self.section])


# (lab, hidden test cell) -> what it must report.  Hidden cells not listed here need no golden outputs:
# they check properties or hand-made cases inside the kernel.
SPECS: dict[tuple[str, str], list[Due]] = {
    ("lab01_naive_decode", "greedy-hidden"): [Due("golden", "greedy", ("token_ids",))],
    # sample: two runs of each kind, decoded by free_run (every case would take 4.6 s of a 15 s grading budget);
    # engine-hidden runs the student's sample on all 40 cases through the engine.
    ("lab01_naive_decode", "sample-hidden"): [Due("golden", "two_per_kind", ("token_ids",))],
    ("lab01_naive_decode", "decode-hidden"): [Due("golden", "one_per_kind", ("token_ids", "tokens_processed"))],
    ("lab01_naive_decode", "engine-hidden"): [Due("golden", "all", ("token_ids",))],
    # lab01's design part (design-search-hidden) reads lab01_search's prompts and needs no golden output: the harness
    # scores the student's completions itself, and the grader holds the target.
    # lab02: CachedAttention steps five runs in one mixed batch, each on its own tokens; cached_decode two of each kind
    ("lab02_kv_cache", "backend-hidden"): [Due("golden", "one_per_kind", ("token_ids", "chosen_logits"))],
    ("lab02_kv_cache", "decode-hidden"): [Due("golden", "two_per_kind", ("token_ids", "chosen_logits"))],
    ("lab02_kv_cache", "engine-hidden"): [Due("golden", "all", ("token_ids",))],
    # lab02's design part: the hidden text's 128 windows are inputs only (nothing to report); the perplexity is observed
    # and judged by the grader against the float32 cache's, which stays in the hidden file (yardsticks.lab02_hidden_ppl)
    ("lab02_kv_cache", "design-kv-ppl-hidden"): [Due("kv_text", "all", ())],
    # lab04: replay-hidden reports its burst; its Poisson trace of the same cases must agree with it, in the kernel
    ("lab04_continuous_batching", "replay-hidden"): [Due("golden", "two_per_kind", ("token_ids",))],
    ("lab04_continuous_batching", "engine-hidden"): [Due("golden", "all", ("token_ids",))],
    # lab05: the engine serves three of each kind and the last n > 1 request (its prompt ends part-way through a block,
    # and its completions part at once) under pressure; sharing forks the first two n > 1 requests and serves
    # two of each kind side by side (copy-on-write, block tables and concurrency are checked in the kernel)
    ("lab05_paged_attention", "engine-hidden"): [Due("golden", "three_per_kind", ("token_ids",)),
                                                 Due("golden", "last_one", ("completions",), "fork_cases")],
    # lab05's design part runs the student's paged search on lab01_search's hidden prompts (inputs only): its blocks,
    # passes and log-likelihood are observed and judged by the grader, so it reports no outputs
    ("lab05_paged_attention", "design-paged-hidden"): [Due("lab01_search", "all", ())],
    ("lab05_paged_attention", "sharing-hidden"): [Due("golden", "first_two", ("completions",), "fork_cases"),
                                                  Due("golden", "two_per_kind", ("token_ids",))],
    # lab06: chisquare-hidden needs a hidden prompt only; rollback-hidden's second run must repeat its first (in the
    # kernel); engine-hidden's sampled requests (rejection sampling) are checked for invariants only
    ("lab06_speculative_decoding", "rollback-hidden"): [Due("golden", "two_per_kind", ("token_ids",)),
                                                        Due("golden", "first_two", ("completions",), "fork_cases")],
    ("lab06_speculative_decoding", "engine-hidden"): [Due("golden", "greedy", ("token_ids",))],
    # lab07: the int4 engine's tokens, and those of the student's mean-pooled GQA conversion
    ("lab07_gqa_and_quantization", "engine-hidden"): [Due("int4", "all", ("token_ids",)),
                                                      Due("gqa2_pooled", "all", ("token_ids",))],
    # lab08: the engine on the student's PrefixCache serves two of each kind twice, after decoys, in three pools (every
    # run must repeat the roomy pool's first round: checked in the kernel) and reports the roomy pool's second round,
    # served from the cache; the engine fed by the student's chunking rule serves three of each kind
    ("lab08_prefix_caching_and_chunked_prefill", "engine-hidden"): [Due("golden", "two_per_kind", ("token_ids",))],
    ("lab08_prefix_caching_and_chunked_prefill", "chunk-hidden"): [Due("golden", "three_per_kind", ("token_ids",))],
    # lab09: the engine on 2 gloo ranks with the student's split and ring all-reduce serves two of each kind
    ("lab09_tensor_parallelism", "engine-hidden"): [Due("golden", "two_per_kind", ("token_ids",))],
    # lab10: the harness's own client sends every hidden prompt to the served engine (stop strings and penalties
    # included) and reports each completion's tokens and text; the student's streaming client reassembles two of each
    # kind, every stop-string case and the penalised ones, and reports what it reassembled
    ("lab10_capstone", "served-hidden"): [Due("golden", "all", ("token_ids", "text")),
                                          Due("sampling_features", "all", ("token_ids", "text")),
                                          Due("lab10_stops", "all", ("token_ids", "text"))],
    ("lab10_capstone", "stream-hidden"): [Due("golden", "two_per_kind", ("token_ids", "text")),
                                          Due("sampling_features", "one_per_kind", ("token_ids", "text")),
                                          Due("lab10_stops", "all", ("token_ids", "text"))],
    # ... and the server with the student's own penalties (process_row) and stop strings (StopRules) plugged serves
    # every hidden penalty, min_p and stop-string case
    ("lab10_capstone", "features-hidden"): [Due("sampling_features", "all", ("token_ids", "text")),
                                            Due("lab10_stops", "all", ("token_ids", "text"))],
}


def spec(lab: str, cell: str) -> list[Due]:
    try:
        return SPECS[(lab, cell)]
    except KeyError:
        raise KeyError(f"{lab}/{cell} has no entry in autograder.hidden_outputs.SPECS") from None


def expected_keys(lab: str, cell: str, files: dict[str, dict]) -> set[tuple[str, str, str, str]]:
    """(file, section, case name, field) for everything ``cell`` must report; ``files`` maps names to data or views."""
    return {(d.file, d.section, c["name"], f) for d in spec(lab, cell) for c in d.cases(files[d.file]) for f in d.fields}


# ------------------------------------------------------------------ the comparison

def _tokens(n: int) -> str:
    return f"{n} token{'s' * (n != 1)}"


def _parting(got, want) -> int:
    """Where two runs or two texts part: the shorter one's length where one is a prefix of the other. (The kernel's
    harnesses have their own, labs/shared.first_difference, which ``pristine`` reloads; this one is the grader's.)"""
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


def _first_difference(got: list, want: list) -> str | None:
    if got == want:
        return None
    t = _parting(got, want)
    if t == len(want):
        return f"your run went on past the reference's last token, at step {t} ({_tokens(len(got))} generated)"
    if t == len(got):
        return f"your run stopped at step {t}, before the reference did"
    return f"first difference at step {t} ({_tokens(len(got))} generated)"


def compare(field: str, got, want) -> str | None:
    """None when ``got`` matches; else a message that says where, and shows nothing of ``want``."""
    if field == "token_ids":
        if not (isinstance(got, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in got)):
            return "the reported tokens are not a list of integers"
        return _first_difference(got, want)
    if field == "tokens_processed":
        ok = isinstance(got, int) and not isinstance(got, bool) and got == want
        return None if ok else f"tokens_processed is wrong (you reported {got!r:.40})"
    if field == "chosen_logits":
        if not (isinstance(got, list) and all(isinstance(x, (int, float)) for x in got)):
            return "the reported logits are not a list of numbers"
        if len(got) != len(want):
            return f"{len(got)} logits reported, one per generated token expected"
        for t, (a, b) in enumerate(zip(got, want)):
            if not (math.isfinite(a) and abs(a - b) <= LOGIT_TOLERANCE):
                return f"step {t}: the chosen token's logit is off by more than {LOGIT_TOLERANCE:g}"
        return None
    if field == "text":
        if not isinstance(got, str):
            return "the reported text is not a string"
        if got == want:
            return None
        c = _parting(got, want)
        if c == len(want):
            return f"your text went on past the reference's end, at character {c} ({len(got)} characters)"
        if c == len(got):
            return f"your text stopped at character {c}, before the reference's did"
        return f"first difference at character {c} ({len(got)} characters)"
    if field == "completions":
        if not (isinstance(got, list) and len(got) == len(want)):
            return f"expected {len(want)} completions, got {len(got) if isinstance(got, list) else type(got).__name__}"
        for i, (g, w) in enumerate(zip(got, want)):
            # a golden completion is a dict: {"index", "seed", "token_ids", "finish_reason"}
            why = compare("token_ids", g, w["token_ids"] if isinstance(w, dict) else w)
            if why:
                return f"completion {i}: {why}"
        return None
    return f"unknown field {field!r}"


def judge(lab: str, cell: str, payloads: list, files: dict[str, dict]) -> tuple[bool, str]:
    """Compare a cell's reports with the golden ``files``: (passed, message for the student)."""
    if len(payloads) != 1:
        return False, ("the hidden test reported no outputs (did it stop before the end?)" if not payloads else
                       f"the hidden test's outputs were reported {len(payloads)} times; a submission may not add reports")
    payload = payloads[0]
    try:
        rows = payload["outputs"]
        got = {(str(f), str(s), str(n), str(k)): v for f, s, n, k, v in rows}
        ok_shape = payload.get("cell") == cell and len(got) == len(rows)
    except (TypeError, ValueError, KeyError, AttributeError):
        ok_shape = False
    if not ok_shape:
        return False, "the hidden test's report is malformed; a submission may not alter it"
    due = expected_keys(lab, cell, files)
    if set(got) != due:
        return False, f"the hidden test reported {len(got)} outputs where {len(due)} were due; a submission may not alter it"
    cases = {(f, s, c["name"]): c for f, data in files.items() for s in SECTIONS for c in data.get(s, [])}
    failures = []
    for key in sorted(due):
        file, section, name, field = key
        why = compare(field, got[key], cases[(file, section, name)][field])
        if why:
            failures.append(f"hidden case {name} ({file}), {field}: {why}")
    if failures:
        cases = {f.split(" (")[0] for f in failures}
        return False, f"{len(cases)} of {len({(k[0], k[2]) for k in due})} hidden cases differ from the reference; first: {failures[0]}"
    return True, ""


def load(name: str, folder: Path | None = None) -> dict:
    with open(Path(folder or HIDDEN_DIR) / f"{name}.json") as f:
        return json.load(f)
