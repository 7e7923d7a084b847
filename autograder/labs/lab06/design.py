"""Lab 06's design part, a prompt-lookup proposer, and the graded numbers. Reloaded by ``autograder.labs.lab06``.

Your ``PromptLookupProposer`` drafts from n-grams already in each sequence (prompt and output) and plugs in where the
engine's draft model goes (the proposer plug point: ``release(live_seq_ids)``, then ``propose(seqs, gammas)``).
The engine verifies with the course's coupled verifier, whose tokens are plain decoding's whatever the drafts, and
the engine's speculative step counts what the verifications emitted: your proposer never sees those counts. So:

  * tokens per target call: (accepted drafts + verifications) / verifications, summed over every request of the
    run, from the engine's own counters (``SpeculativeDecoder.accepted`` and ``.verified``);
  * rejected drafts per token: (drafted - accepted) / the tokens the verifications emitted. A draft proposed
    blindly long costs the target's pass that many wasted positions, and this bounds it.

Your proposer sees each sequence through a read-only view (``seq_id``, ``token_ids`` as a tuple, ``num_tokens``,
``num_prompt_tokens``, ``params``), and no model may run while it proposes (prompt lookup costs no model call):
calling one fails the test. Its answer must be one list of drafted token ids per sequence, at most ``gammas[i]``
long, and one list of q rows per sequence (a deterministic proposer's q is one-hot; the coupled verifier ignores it).
"""
from __future__ import annotations

import contextlib
import functools
import inspect

import numpy as np
import torch

import autograder.notebook_checks as checks
from autograder.notebook_checks.ledger import credit
from miniengine.config import EngineConfig
from miniengine.engine import LLMEngine
from miniengine.sampling import SamplingParams
from miniengine.spec.decoding import SpeculativeDecoder

GAMMA_CAP = 8  # the engine's num_speculative_tokens: gammas[i] is at most this (fewer near max_tokens)
MAX_TOKENS = 128  # greedy, per prompt
# Thresholds, set from the honest designs measured in autograder/qa/design/lab06.py (visible and hidden prompts).
MIN_TOKENS_PER_CALL = 1.7
MAX_REJECTED_PER_TOKEN = 0.8
PLAIN_DECODING = 1.0  # the baseline's tokens per target call: a proposer that proposes nothing


class SeqView:
    """A sequence as your proposer sees it: what it may read, and nothing it could change in the engine."""

    __slots__ = ("seq_id", "token_ids", "num_prompt_tokens", "params")

    def __init__(self, seq):
        self.seq_id, self.token_ids = seq.seq_id, tuple(seq.token_ids)
        self.num_prompt_tokens, self.params = seq.num_prompt_tokens, seq.params

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@contextlib.contextmanager
def no_model_calls(what: str):
    """While your proposer runs, calling any torch module (a model, a layer) fails the test."""
    original = torch.nn.Module.__call__

    def refuse(module, *args, **kwargs):
        raise AssertionError(f"{what}: your proposer called a model ({type(module).__name__}) while proposing; "
                             f"prompt lookup drafts from the tokens alone, at no model call")

    torch.nn.Module.__call__ = refuse
    try:
        yield
    finally:
        torch.nn.Module.__call__ = original


class Watched:
    """Your proposer as the engine calls it: read-only views in, its answer held to the plug point's rules."""

    def __init__(self, proposer, what: str):
        self.proposer, self.what, self.calls = proposer, what, 0

    def release(self, live_seq_ids) -> None:
        try:
            self.proposer.release(set(live_seq_ids))
        except Exception as e:
            raise AssertionError(f"{self.what}: release(live_seq_ids) raised {type(e).__name__}: {e}") from e

    def propose(self, seqs, gammas):
        where = f"{self.what}, call {self.calls} of propose"
        self.calls += 1
        views, gammas = [SeqView(s) for s in seqs], [int(g) for g in gammas]
        with no_model_calls(where):
            try:
                answer = self.proposer.propose(views, list(gammas))
            except AssertionError:
                raise
            except Exception as e:
                raise AssertionError(f"{where}: propose raised {type(e).__name__}: {e}") from e
        assert isinstance(answer, tuple) and len(answer) == 2, (
            f"{where}: propose must return a pair (drafts, draft_probs), got {type(answer).__name__}")
        drafts, qs = answer
        assert len(drafts) == len(seqs) and len(qs) == len(seqs), (
            f"{where}: {len(seqs)} sequences, so one list of drafts and one of q rows each; got {len(drafts)} and "
            f"{len(qs)}")
        out = []
        for i, (d, g) in enumerate(zip(drafts, gammas)):
            d = checks.as_tokens(list(d), f"{where}: drafts[{i}]")
            assert len(d) <= g, f"{where}: drafts[{i}] has {len(d)} tokens, but gammas[{i}] = {g} allows at most {g}"
            assert len(qs[i]) == len(d), f"{where}: draft_probs[{i}] must hold one q row per draft ({len(d)})"
            out.append(d)
        return out, [list(q) for q in qs]


def speculative_engine(model, proposer, gamma: int = GAMMA_CAP, max_num_seqs: int = 8) -> LLMEngine:
    """The course's engine with ``proposer`` where the draft model goes, verifying with the coupled verifier."""
    config = EngineConfig(model=model, device=model.device.type, speculative_model=model, num_speculative_tokens=gamma,
                          max_num_seqs=max_num_seqs)  # the target stands in as the unused draft: the proposer drafts
    return LLMEngine(config, speculative=functools.partial(SpeculativeDecoder, proposer=proposer))


def prompts_of(golden: dict) -> list[tuple[str, list[int]]]:
    """The distinct prompts of a golden file's cases, named by their case prefix (p0, p1, ...)."""
    out = []
    for c in golden["cases"]:
        if all(c["prompt_token_ids"] != ids for _, ids in out):
            out.append((c["name"].split("-")[0], list(c["prompt_token_ids"])))
    return out


def run_lookup(model, proposer, prompts, what: str) -> dict:
    """Every prompt greedy for MAX_TOKENS tokens through ``proposer``; the engine's counts and each output."""
    watched = Watched(proposer, what)
    engine = speculative_engine(model, watched)
    seqs = [engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)) for _, ids in prompts]
    try:
        while engine.has_unfinished_requests():
            engine.step()
    except AssertionError:
        raise
    except Exception as e:
        raise AssertionError(f"{what}: the engine raised {type(e).__name__} with your proposer: {e}") from e
    spec = engine.spec
    emitted = spec.accepted + spec.verified
    return {"tokens_per_call": emitted / spec.verified, "rejected_per_token": (spec.drafted - spec.accepted) / emitted,
            "drafted": spec.drafted, "accepted": spec.accepted, "verified": spec.verified,
            "outputs": [list(s.output_token_ids) for s in seqs]}


def plain_outputs(model, prompts) -> list[list[int]]:
    """Plain greedy decoding on the course's engine, no speculation: what the coupled verifier must reproduce."""
    engine = LLMEngine(EngineConfig(model=model, max_num_seqs=8))
    seqs = [engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)) for _, ids in prompts]
    while engine.has_unfinished_requests():
        engine.step()
    return [list(s.output_token_ids) for s in seqs]


def require_class(cls, name: str) -> None:
    assert inspect.isclass(cls), f"{name} must be a class, got {type(cls).__name__}"
    assert cls.__module__ == "__main__", (
        f"{name} must be defined in this notebook, not imported from {cls.__module__!r}")


def make(Proposer, what: str, **kwargs):
    try:
        return Proposer(**kwargs)
    except NotImplementedError:
        raise  # the unwritten stub: an error, not a wrong answer
    except Exception as e:
        raise AssertionError(f"{what}: {Proposer.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}) "
                             f"raised {type(e).__name__}: {e}") from e


# ---------------------------------------------------------------- design-args-visible

def check_proposer_arguments(Proposer, good: dict, cases) -> None:
    """cases: (keyword arguments that are wrong, the field the ValueError must name); ``good`` fills in the rest."""
    require_class(Proposer, "PromptLookupProposer")
    make(Proposer, "valid arguments", **good)
    for bad, field in cases:
        kwargs = {**good, **bad}
        call = f"{Proposer.__name__}(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")"
        try:
            Proposer(**kwargs)
        except ValueError as e:
            assert field in str(e), f"{call} raised ValueError({str(e)!r}), which should name the field {field!r}"
            checks.observe(f"{call}: raises ValueError naming {field!r}", True, expect=True)
            continue
        except NotImplementedError:
            raise
        except Exception as e:
            raise AssertionError(f"{call} should raise ValueError naming {field!r} and its allowed range, "
                                 f"got {type(e).__name__}: {e}") from None
        raise AssertionError(f"{call} returned without an error; it should raise ValueError naming {field!r}")


# ---------------------------------------------------------------- design-lookup-visible / -hidden

def observe_targets(run: dict, label: str) -> float:
    """The two design targets for the grader, and the share of the cell's points they earn (printed, not raised:
    a missed target earns partial credit, between plain decoding and the threshold)."""
    tpc, rej = run["tokens_per_call"], run["rejected_per_token"]
    checks.observe(f"{label}tokens per target call", tpc, at_least=MIN_TOKENS_PER_CALL, baseline=PLAIN_DECODING)
    checks.observe(f"{label}rejected drafts per emitted token", rej, at_most=MAX_REJECTED_PER_TOKEN)
    share = min(credit(tpc, at_least=MIN_TOKENS_PER_CALL, baseline=PLAIN_DECODING),
                credit(rej, at_most=MAX_REJECTED_PER_TOKEN))
    print(f"{label}tokens per target call {tpc:.3f} (target at least {MIN_TOKENS_PER_CALL}; plain decoding "
          f"{PLAIN_DECODING:.1f}), rejected drafts per emitted token {rej:.3f} (at most {MAX_REJECTED_PER_TOKEN}): "
          f"{share:.0%} of this test's points")
    return share


def check_lookup(Proposer, golden: dict, label: str = "") -> dict:
    """Visible: the golden prompts, greedy, through your proposer; the tokens must be plain decoding's, and the
    engine's counts give the two targets."""
    require_class(Proposer, "PromptLookupProposer")
    prompts = prompts_of(golden)
    model = checks.load_model()
    run = run_lookup(model, make(Proposer, "your proposer's defaults"), prompts, f"{label}your proposer")
    for (name, _), got, want in zip(prompts, run["outputs"], plain_outputs(model, prompts)):
        checks.observe(f"{label}{name}: token_ids", got, expect=want)
        t = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        assert got == want, (f"{label}{name}: your proposer's run differs from plain greedy decoding at token {t} "
                             f"({len(got)} and {len(want)} tokens); the coupled verifier keeps only the target's "
                             f"tokens, so a drafted token was misread (check the ids you return)")
    observe_targets(run, label)
    return run


def check_lookup_hidden(Proposer, golden: dict, label: str = "") -> None:
    """Hidden: the same on hidden prompts; the grader compares the tokens with the reference's outside the kernel."""
    require_class(Proposer, "PromptLookupProposer")
    prompts = prompts_of(golden)
    run = run_lookup(checks.load_model(), make(Proposer, "your proposer's defaults"), prompts, f"{label}your proposer")
    for (name, _), got in zip(prompts, run["outputs"]):
        checks.observe(f"{label}{name}: token_ids", got)
    observe_targets(run, label)


# ---------------------------------------------------------------- graded numbers

def _number(ns, name):
    if name not in ns:
        raise NameError(f"{name} is not defined: set it in the cell above")
    x = ns[name]
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        x = x.item()
    ok = isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))
    assert ok and np.isfinite(x), f"{name} should be a number (an int or a float), got {type(x).__name__} {x!r:.40}"
    return float(x)


def check_numbers(ns, tolerances: dict) -> None:
    """Visible: each answer is a finite number. Its value is checked only when graded: the answer sheet holds the
    right one (when_graded), and ``check`` says so."""
    for name, tolerance in tolerances.items():
        checks.observe(f"{name} (within {tolerance:g})", _number(ns, name), tol=tolerance, when_graded=True)


def report_numbers(ns, tolerances: dict) -> None:
    """Hidden: each answer's value; the grader compares it with the right one, which never enters the notebook."""
    for name, tolerance in tolerances.items():
        checks.observe(f"hidden: {name} (within {tolerance:g})", _number(ns, name), tol=tolerance)
