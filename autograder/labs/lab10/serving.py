"""Your engine behind the server (Task 3) and your streaming client (Task 2). Reloaded by ``autograder.labs.lab10``.

Every check starts ``python -m miniengine serve`` with the flags your ``serve_flags`` writes for the tests' engine
(SERVED: small budgets, chunked prefill, so that requests queue and share steps). Task 3 adds your saved parts of
labs 01-09 (``engine_config``: the plug points name ``autograder.labs.lab10.served``, which builds them in the
server's process): outside grading from mine/, under grading from the mine/ handed in with the notebook, as it is
(served.py says which parts count). Then:

* served (``check_served`` / ``report_served``): the harness's own client sends every case at once, non-streaming;
  each completion's token ids and text must be the golden ones (hidden: they go to the grader, which compares them
  outside your kernel), and its usage must count the prompt's tokens and every generated token (a stop string's cut
  tokens included, as vLLM counts them).
* stream (``check_stream`` / ``report_stream``): your ``stream_completion(base_url, body)`` on each case; what it
  returns must be the golden text and token ids and finish reason, and equal the server's own non-streamed answer
  (joined chunks equal the non-streamed text). Hidden: its text and token ids go to the grader.
"""
from __future__ import annotations

import autograder.notebook_checks as checks
from autograder.labs.lab10 import common
from autograder.labs.lab10.flags import flags_for

# The tests' engine: 8 seats, 64 tokens per step with chunked prefill, 4,096 KV positions in blocks of 16.
SERVED = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "enable_chunked_prefill": True, "kv_cache_tokens": 4096}
PARTS = "autograder.labs.lab10.served"  # the module whose attributes are your saved parts, for the plug flags


def engine_config(base: dict = SERVED) -> tuple[dict, list[str]]:
    """``base`` plus your saved parts of labs 01-09 as plug strings (``module:attribute``), and the parts' names.
    With nothing saved (under grading: no mine/ handed in): ``base`` alone, every part the course's."""
    from autograder.labs.lab10 import served

    keys = served.yours()
    config = dict(base)
    for field, attribute in served.PLUGS.items():
        if attribute in keys:
            config[field] = f"{PARTS}:{attribute}"
    return config, keys


def _served_flags(serve_flags, config, parts, what, hidden):
    """Your flags for the tests' engine, observed as the answer sheet knows it (SERVED); with your parts plugged,
    checked here too, unobserved (the sheet holds the course's solution, which has no parts)."""
    flags = flags_for(serve_flags, dict(SERVED), what, hidden=hidden)
    return flags_for(serve_flags, config, what, hidden=hidden, observe=False) if parts else flags


def _say_parts():
    """Under grading: which parts came from the mine/ handed in (the feedback shows the cell's output)."""
    from autograder.labs.lab10 import served

    line = served.handed_in_report()
    if line:
        print(line)


def _own_client(stream_completion):
    checks.require_own(stream_completion, "stream_completion")


def _reassembled(stream_completion, url, case, what):
    """Your client's answer for ``case``, as plain values."""
    try:
        got = stream_completion(url, common.body(case))
    except NotImplementedError:
        raise
    except Exception as e:
        raise AssertionError(f"{what}: stream_completion raised {type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(got, dict) or not {"text", "token_ids", "finish_reason"} <= set(got):
        raise AssertionError(f"{what}: stream_completion must return a dict with text, token_ids and finish_reason, "
                             f"got {type(got).__name__} {str(got)[:80]}")
    if not isinstance(got["text"], str):
        raise AssertionError(f"{what}: text must be a str, got {type(got['text']).__name__}")
    ids = checks.as_tokens(got["token_ids"], f"{what}: token_ids")
    reason = got["finish_reason"]
    if not isinstance(reason, str):
        raise AssertionError(f"{what}: finish_reason must be a str, got {type(reason).__name__} {reason!r:.40}")
    return {"text": str(got["text"]), "token_ids": ids, "finish_reason": str(reason)}


def _check_usage(what, case, answer):
    usage = answer["usage"]
    want = {"prompt_tokens": len(case["prompt_token_ids"]), "completion_tokens": len(answer["token_ids"])}
    want["total_tokens"] = want["prompt_tokens"] + want["completion_tokens"]
    got = {k: usage.get(k) for k in want}
    assert got == want, f"{what}: usage {got}, expected {want}"
    return got


def check_served(serve_flags, files, label: str = "") -> int:
    """Visible: every case of the golden ``files`` through the server started with your flags; tokens, text, finish
    reason and usage. Returns the number of cases."""
    checks.require_own(serve_flags, "serve_flags")
    config, parts = engine_config()
    flags = _served_flags(serve_flags, config, parts, f"{label}serve_flags for the tests' engine", False)
    cases = common.load_cases(files)
    tok = checks.load_tokenizer()
    print(f"{label}serving with {' '.join(flags)}" + (f" (your parts: {', '.join(parts)})" if parts else ""))
    _say_parts()
    with common.server(flags, f"{label}your engine") as url:
        answers = common.complete_all(url, [c for _, c in cases])
    try:
        for (file, case), answer in zip(cases, answers):
            what = f"{label}{file} {case['name']} through the server"
            common.compare_answer(what, answer, case, tok)
            _check_usage(what, case, answer)
    except AssertionError as e:
        if not parts:
            raise
        raise AssertionError(f"{e} (served with your parts for {', '.join(parts)}: a part of yours differs from the "
                             f"course's here, or your flags; each lab's `python -m autograder check` runs its "
                             f"visible tests)") from None
    return len(cases)


def report_served(serve_flags, report, label: str = "hidden: ") -> int:
    """Hidden: every hidden case through the server; each completion's tokens and text go to the grader."""
    checks.require_own(serve_flags, "serve_flags")
    config, parts = engine_config()
    flags = _served_flags(serve_flags, config, parts, f"{label}serve_flags for the tests' engine", True)
    due = [(f, c) for f in ("golden", "sampling_features", "lab10_stops") for c in report.cases(f)]
    _say_parts()
    with common.server(flags, f"{label}your engine") as url:
        answers = common.complete_all(url, [c for _, c in due])
    for (file, case), answer in zip(due, answers):
        _check_usage(f"hidden case {case['name']} ({file})", case, answer)
        report.add(file, case, "token_ids", answer["token_ids"])
        report.add(file, case, "text", answer["text"])
    return len(due)


def check_stream(stream_completion, serve_flags, files, pick: dict | None = None, label: str = "") -> int:
    """Visible: your streaming client on the cases of ``files`` (``pick``: {file name: case names}, None for all):
    the golden tokens, text and finish reason, and the server's own non-streamed answer."""
    _own_client(stream_completion)
    checks.require_own(serve_flags, "serve_flags")
    flags = flags_for(serve_flags, dict(SERVED), f"{label}serve_flags for the tests' engine")
    cases = [(f, c) for f, c in common.load_cases(files) if pick is None or c["name"] in pick.get(f, ())]
    tok = checks.load_tokenizer()
    with common.server(flags, f"{label}the server") as url:
        plain = common.complete_all(url, [c for _, c in cases])
        for (file, case), whole in zip(cases, plain):
            what = f"{label}{file} {case['name']}, streamed"
            got = _reassembled(stream_completion, url, case, what)
            common.compare_answer(what, got, {k: whole[k] for k in ("text", "token_ids", "finish_reason")}, tok)
            common.compare_answer(what + " (golden)", got, case, tok)
    return len(cases)


def report_stream(stream_completion, serve_flags, report, label: str = "hidden: ") -> int:
    """Hidden: your streaming client on the hidden cases; what it reassembled goes to the grader. Within the kernel, it
    must also equal the server's own non-streamed answer (which is no golden value)."""
    _own_client(stream_completion)
    checks.require_own(serve_flags, "serve_flags")
    flags = flags_for(serve_flags, dict(SERVED), f"{label}serve_flags for the tests' engine", hidden=True)
    due = [(f, c) for f in ("golden", "sampling_features", "lab10_stops") for c in report.cases(f)]
    with common.server(flags, f"{label}the server") as url:
        plain = common.complete_all(url, [c for _, c in due])
        for (file, case), whole in zip(due, plain):
            what = f"hidden case {case['name']} ({file}), streamed"  # the grader shows a message that names the case
            got = _reassembled(stream_completion, url, case, what)
            report.add(file, case, "token_ids", got["token_ids"])
            report.add(file, case, "text", got["text"])
            same = got["text"] == whole["text"] and got["token_ids"] == whole["token_ids"]
            checks.observe(f"{what}: equals the non-streamed answer", same, expect=True)
            assert same, (f"{what}: your reassembled completion differs from the server's non-streamed answer "
                          f"({'text' if got['text'] != whole['text'] else 'token ids'}; "
                          f"{len(got['text'])} characters, {len(got['token_ids'])} tokens)")
    return len(due)
