"""Lab 01's tests of Task 7, the design part: a search for a likely completion under a budget of forward passes.

design-args-visible: a bad max_tokens, budget or eos_token_id raises ValueError naming the argument.
design-search-visible: the worked example's bigram model, then the visible prompts of data/golden/lab01_search.json.
design-search-hidden: another bigram model, then the hidden prompts (autograder/hidden/lab01_search.json, inputs only).

What each case measures, the same way for every student:
  * validity: one completion, a list of token ids after the prompt, of max_tokens tokens unless it ends at
    end-of-text (which it then holds once, last);
  * the passes: one sequence through the model is one pass (a call on a ragged batch of k sequences is k). They are
    counted by hooks on every module of torch while the search runs, not by a wrapper around the model: the model
    handed to the search, the notebook's `model`, one loaded afresh with load_model, or a closure over any of them,
    all count the same, and a layer called outside a whole-model call is refused (it would go uncounted). The pass
    that would go past the budget raises instead of running, so no search can spend more than its budget;
  * the score: the harness's own float64 model scores the returned tokens (one teacher-forced pass over prompt and
    completion): the mean log-probability per generated token, end-of-text included. The student reports no score.
The mean score over a set's prompts is the design target: full points at the target, none at greedy decoding's
value (the course baseline), a linear share between (autograder/notebook_checks/ledger.py, credit).

What this cannot see: a search that rebuilds the transformer from the raw weights in numpy, or runs it in a process
of its own, goes uncounted; the answer policy and an instructor's reading are what stand there.

Part of the lab01 harness: autograder/labs/lab01/__init__.py reloads this module and hands its functions to the test cells.
"""
from __future__ import annotations

import json
import types

import numpy as np
import torch

from autograder import notebook_checks as checks
from autograder.notebook_checks import ledger
from miniengine.attention import NoCacheBackend

SEARCH = "lab01_search"  # data/golden/lab01_search.json; the hidden prompts' twin stays with the grader


class PassRefused(RuntimeError):
    """Raised instead of a forward pass the meter cannot count (a layer on its own, a backend other than the naive
    loop's)."""


class BudgetSpent(PassRefused):
    """Raised instead of a forward pass that would go past the search's budget."""


def visible_search() -> dict:
    with open(checks.VISIBLE_GOLDEN.parent / f"{SEARCH}.json") as f:
        return json.load(f)


class BigramModel:
    """A stand-in for the model in hand-made cases: the next token's probabilities depend on the last token only.

    Called as the real model is, ``model(input_ids, positions, backend, logits_indices=None)``; its logits are
    log(probabilities). Not a torch module, so it counts its own passes (one per sequence of the backend)."""

    def __init__(self, probs, budget=None):
        self._table = torch.log(torch.tensor(probs, dtype=torch.float64))
        self._budget, self._passes = budget, 0
        self.device, self.dtype = torch.device("cpu"), torch.float64
        self.config = types.SimpleNamespace(vocab_size=len(probs), eos_token_id=0)

    def __call__(self, input_ids, positions, backend, logits_indices=None):
        n = len(backend.seq_lens) if isinstance(backend, NoCacheBackend) else 1
        if self._budget is not None and self._passes + n > self._budget:
            raise BudgetSpent(f"this call would make pass {self._passes + n} of a budget of {self._budget}")
        self._passes += n
        rows = self._table[torch.as_tensor(input_ids).long()]
        return rows if logits_indices is None else rows[torch.as_tensor(logits_indices).long()]

    forward = __call__

    def passes(self) -> int:
        return self._passes


class PassMeter:
    """Counts the passes of every model of the course's class while a search runs (see the module's docstring)."""

    def __init__(self, budget: int):
        from miniengine.model import Llama

        self.model_class, self.budget = Llama, budget
        self.passes = self.calls = self.tokens = 0
        self.depth, self.handles = 0, []

    def before(self, module, args):
        if isinstance(module, self.model_class):
            self.depth += 1
        elif self.depth == 0:
            raise PassRefused(f"the search called the model's {type(module).__name__} on its own; call the whole "
                               f"model, model(input_ids, positions, backend): its parts called one by one go uncounted")

    def after(self, module, args, kwargs, output=None):
        if not isinstance(module, self.model_class):
            return
        self.depth -= 1
        named = dict(zip(("input_ids", "positions", "backend"), args), **kwargs)
        backend = named.get("backend")
        if type(backend) is not NoCacheBackend:
            raise PassRefused(f"the search ran the model with {type(backend).__name__}; the budget is counted on "
                               f"the naive loop: NoCacheBackend(seq_lens)")
        self.calls += 1
        self.tokens += int(torch.as_tensor(named.get("input_ids")).numel())
        self.passes += len(backend.seq_lens)
        if self.passes > self.budget:  # the pass ran, but its logits never reach the search
            raise BudgetSpent(f"the search asked for pass {self.passes} of a budget of {self.budget}")

    def __enter__(self):
        hooks = torch.nn.modules.module
        self.handles = [hooks.register_module_forward_pre_hook(self.before),
                        hooks.register_module_forward_hook(self.after, with_kwargs=True, always_call=True)]
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()


def as_completion(out, max_tokens: int, eos: int, vocab: int, what: str, prompt=()) -> list[int]:
    """Your result as a plain list of ids, checked against the contract before it is scored."""
    if isinstance(out, tuple) and len(out) == 2 and not isinstance(out[1], (int, np.integer)):
        raise AssertionError(f"{what}: return the completion's token ids alone (a list), not a (tokens, score) "
                             f"pair: the harness scores it itself")
    tokens = checks.as_tokens(out, f"{what}: the completion")
    assert tokens, f"{what}: an empty completion; at least one token is generated"
    assert len(prompt) < 2 or tokens[:len(prompt)] != list(prompt), (
        f"{what}: the completion starts with the prompt; return the generated tokens only")
    assert all(0 <= t < vocab for t in tokens), f"{what}: a token id outside 0..{vocab - 1}"
    assert eos not in tokens[:-1], (f"{what}: the completion goes on after end-of-text (id {eos}, at step "
                                    f"{tokens.index(eos)}); end-of-text ends a completion")
    assert len(tokens) <= max_tokens, f"{what}: {len(tokens)} tokens, more than max_tokens={max_tokens}"
    assert len(tokens) == max_tokens or tokens[-1] == eos, (
        f"{what}: {len(tokens)} tokens that do not end at end-of-text; a completion has max_tokens={max_tokens} "
        f"tokens unless it ends at end-of-text")
    return tokens


def mean_log_likelihood(scorer, prompt: list[int], tokens: list[int]) -> float:
    """The mean float64 log-probability of each generated token given everything before it (teacher forcing)."""
    seq = list(prompt) + list(tokens)
    n = len(seq)
    with torch.no_grad():
        logits = scorer(torch.tensor(seq), torch.arange(n), NoCacheBackend([n]))
        logp = torch.log_softmax(logits.double(), dim=-1)
    rows = torch.arange(len(prompt) - 1, n - 1)
    return float(logp[rows, torch.tensor(tokens)].mean())


def run_search(search_completion, model, prompt, max_tokens, budget, eos, what):
    """(tokens, passes): the search of one prompt, its passes counted below the model."""
    try:
        if isinstance(model, BigramModel):
            out = search_completion(model, list(prompt), max_tokens, budget, eos)
            passes = model.passes()
        else:
            with PassMeter(budget) as meter:
                out = search_completion(model, list(prompt), max_tokens, budget, eos)
            passes = meter.passes
    except PassRefused as e:  # the harness's own words, naming the case (a hidden one's message is then shown)
        raise AssertionError(f"{what}: {e}") from None
    return as_completion(out, max_tokens, eos, model.config.vocab_size, what, list(prompt)), passes


def observe_mean(label: str, scores: list[float], at_least: float, baseline: float) -> float:
    """The design target, observed with its scale; printed here with the share it earns (the grader decides)."""
    mean = float(np.mean(scores))
    checks.observe(label, mean, at_least=at_least, baseline=baseline)
    share = ledger.credit(mean, at_least=at_least, baseline=baseline)
    print(f"{label}: {mean:.4f} (target at least {at_least:.4f}, greedy decoding {baseline:.4f}): "
          f"{share:.0%} of the points")
    return mean


# ---------------------------------------------------------------- design-args-visible

def check_search_arguments(search_completion, cases) -> None:
    """cases: (keyword arguments that are wrong, the argument the ValueError must name)."""
    checks.require_own(search_completion, "search_completion")
    for bad, field in cases:
        kwargs = {**dict(max_tokens=3, budget=6, eos_token_id=0), **bad}
        call = "search_completion(" + ", ".join(f"{k}={v!r}" for k, v in bad.items()) + ")"
        try:
            search_completion(BigramModel([[0.25] * 4] * 4), [1], **kwargs)
        except ValueError as e:
            assert field in str(e), f"{call} raised ValueError({str(e)!r}), which should name the argument {field!r}"
            checks.observe(f"{call}: raises ValueError naming {field!r}", True, expect=True)
            continue
        except NotImplementedError:
            raise  # the unwritten stub: an error, not a wrong answer
        except Exception as e:
            raise AssertionError(f"{call} should raise ValueError naming {field!r} and its allowed range, "
                                 f"got {type(e).__name__}: {e}") from None
        raise AssertionError(f"{call} returned without an error; it should raise ValueError naming {field!r}")


# ---------------------------------------------------------------- design-search-visible / -hidden

def check_search_bigram(search_completion, cases, hidden=False) -> None:
    """Hand-made cases: (probability table, prompt, max_tokens, budget, target, greedy's score). Each completion must
    be valid and within the budget; its score is a target with greedy's as the baseline."""
    checks.require_own(search_completion, "search_completion")
    with checks.reference_forbidden("search_completion"):
        for k, (table, prompt, max_tokens, budget, target, greedy_score) in enumerate(cases):
            what = (f"hidden hand-made case {k}" if hidden
                    else f"hand-made case {k} (prompt {prompt}, max_tokens={max_tokens}, budget={budget})")
            model = BigramModel(table, budget)
            tokens, passes = run_search(search_completion, model, prompt, max_tokens, budget, 0, what)
            checks.observe(f"{what}: passes", passes, at_most=budget)
            score = mean_log_likelihood(model, prompt, tokens)
            if not hidden:
                print(f"{what}: {tokens}, {passes} passes")
            observe_mean(f"{what}: normalised log-likelihood", [score], target, greedy_score)


def search_prompts(search_completion, cases, eos, target, baseline, kind) -> None:
    """Every case through the float32 model under a PassMeter, scored by the float64 model."""
    model32, model64 = checks.load_model(), checks.load_model(torch.float64)
    scores, passes, threads = [], [], torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on a busy 2-core grader ran this 20x slower (81 s against 3.5 s); restored below
    try:
        for case in cases:
            p, name = case["params"], f"{kind} case {case['name']}"
            tokens, n = run_search(search_completion, model32, case["prompt_token_ids"], p["max_tokens"], p["budget"],
                                   eos, name)
            scores.append(mean_log_likelihood(model64, case["prompt_token_ids"], tokens))
            passes.append(n)
    finally:
        torch.set_num_threads(threads)
    budget = min(c["params"]["budget"] for c in cases)  # one row for all: each search was held to its own already
    print(f"{kind} prompts: {len(cases)}, passes per prompt {passes} (budget {budget})")
    checks.observe(f"{kind} prompts: the most passes one search used", max(passes), at_most=budget)
    observe_mean(f"{kind} prompts: mean normalised log-likelihood over {len(cases)} prompts", scores, target, baseline)


def check_search(search_completion, target, baseline) -> int:
    """The visible prompts. Returns how many."""
    checks.require_own(search_completion, "search_completion")
    with checks.reference_forbidden("search_completion"):
        data = visible_search()
        search_prompts(search_completion, data["cases"], data["eos_token_id"], target, baseline, "visible")
    return len(data["cases"])


def report_search(search_completion, target, baseline) -> None:
    """Hidden: the hidden prompts (inputs only enter the kernel; there is no expected output to keep out)."""
    checks.require_own(search_completion, "search_completion")
    with checks.reference_forbidden("search_completion"):
        data = checks.hidden_inputs(SEARCH)
        search_prompts(search_completion, data["cases"], data["eos_token_id"], target, baseline, "hidden")
