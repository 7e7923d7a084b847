"""The golden runs' side of a test: the models, float64 logits of golden cases, and a free run on the student's picks.

Nothing here computes an expected answer: golden logits are the inputs a sampler is tested on, and a free run
follows the student's own tokens, for the grader to compare with the stored golden ones.
"""
from __future__ import annotations

import importlib

import numpy as np
import torch

from miniengine import paths as _paths

# Re-read the paths module too: a cell that set ``paths.GOLDEN = ...`` must not move the tests' files.
_paths = importlib.reload(_paths)
VISIBLE_GOLDEN = _paths.GOLDEN / "visible.json"
HIDDEN_GOLDEN = _paths.REPO_ROOT / "autograder" / "hidden" / "golden.json"
TARGET = _paths.TARGET


def load_model(dtype=torch.float32):
    """A fresh copy of the target model on the CPU: float32 to decode with, float64 for the tests' logits."""
    from miniengine.model import load_model as _load

    return _load(TARGET, dtype=dtype)


def load_tokenizer():
    from miniengine.tokenizer import load_tokenizer as _load

    return _load(TARGET)


@torch.no_grad()
def golden_logits(model64, case) -> np.ndarray:
    """Row t holds the float64 logits that predict generated token t of a golden case.

    One causal forward pass over prompt + generated tokens gives every step's logits at once:
    row Lp-1+t sees exactly the prefix that step t of naive decode sees.
    """
    from miniengine.attention import NoCacheBackend

    prompt, tokens = case["prompt_token_ids"], case["token_ids"]
    ids = prompt + tokens[:-1]
    n = len(ids)
    logits = model64(torch.tensor(ids), torch.arange(n), NoCacheBackend([n]))
    return logits[len(prompt) - 1:].numpy()


@torch.no_grad()
def prompt_logits(model64, case) -> np.ndarray:
    """The float64 logits that predict a case's first generated token: they need only the prompt."""
    from miniengine.attention import NoCacheBackend

    prompt = case["prompt_token_ids"]
    return model64(torch.tensor(prompt), torch.arange(len(prompt)), NoCacheBackend([len(prompt)]))[-1].numpy()


@torch.no_grad()
def free_run(model64, cases: list[dict], pick, eos_token_id: int) -> list[list[int]]:
    """Decode every case with the float64 reference model, choosing each token with ``pick(logits_row, case, step)``.

    ``pick`` is the student's function under test.  Not ``reference.naive_generate``: that is Lab 01's answer key,
    which ``reference_forbidden`` makes fail while these tests run.  Each run follows the student's own tokens, so it needs no
    golden output: when every pick is right it retraces the golden run exactly, and the grader compares.  All
    cases advance together, one ragged forward pass per step, so the cost is the longest run's steps.
    """
    from miniengine.attention import NoCacheBackend

    seqs = [list(c["prompt_token_ids"]) for c in cases]
    outs: list[list[int]] = [[] for _ in cases]
    active = list(range(len(cases)))
    t = 0
    while active:
        lens = [len(seqs[i]) for i in active]
        ids = torch.tensor([tok for i in active for tok in seqs[i]])
        positions = torch.cat([torch.arange(n) for n in lens])
        last = torch.tensor(lens).cumsum(0) - 1
        rows = model64(ids, positions, NoCacheBackend(lens), logits_indices=last).numpy()
        still = []
        for row, i in zip(rows, active):
            params = cases[i]["params"]
            token = pick(row, cases[i], t)
            outs[i].append(token)
            seqs[i].append(token)
            ended = token == eos_token_id and not params.get("ignore_eos", False)
            if not ended and len(outs[i]) < params.get("max_tokens", 16):
                still.append(i)
        active, t = still, t + 1
    return outs


class RecordingModel:
    """Wraps the model and records what each call feeds it, to check that decode recomputes the prefix.

    The calls are recorded by a hook on the real model, not by the wrapper: a search that reaches the model some
    other way than through this object is counted all the same.  Use it as a context manager (``with
    RecordingModel(model) as recorder``), which removes the hook at the end.
    """

    def __init__(self, model):
        self.model = model
        self.calls: list[dict] = []
        self.hook = model.register_forward_pre_hook(self.record, with_kwargs=True)

    def record(self, module, args, kwargs):
        input_ids, positions, backend = (list(args) + [kwargs.get(k) for k in ("input_ids", "positions", "backend")
                                                       ][len(args):])[:3]
        self.calls.append({
            "n": int(len(input_ids)),
            "ids": [int(t) for t in torch.as_tensor(input_ids).reshape(-1).tolist()],
            "positions": [int(p) for p in torch.as_tensor(positions).reshape(-1).tolist()],
            "backend": type(backend).__name__,
            "seq_lens": list(getattr(backend, "seq_lens", [])),
        })

    def __call__(self, input_ids, positions, backend, *args, **kwargs):
        return self.model(input_ids, positions, backend, *args, **kwargs)

    forward = __call__

    def __getattr__(self, name):  # config, device, dtype, ... come from the real model
        return getattr(self.__dict__["model"], name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.hook.remove()


def check_prefix_recompute(calls: list[dict], prompt: list[int], tokens: list[int], what: str):
    """Step t must feed prompt + tokens[:t] at positions 0..n-1 through a NoCacheBackend([n])."""
    assert len(calls) == len(tokens), (
        f"{what}: generated {len(tokens)} tokens with {len(calls)} model calls; naive decode makes one call per token")
    for t, call in enumerate(calls):
        want = prompt + tokens[:t]
        n = len(want)
        assert call["backend"] == "NoCacheBackend", (
            f"{what}, step {t}: the model was called with a {call['backend']}; use NoCacheBackend([n])")
        assert call["n"] == n and call["ids"] == want, (
            f"{what}, step {t}: expected the whole sequence so far ({n} tokens: the prompt plus {t} generated), "
            f"got {call['n']} tokens" + ("" if call["n"] != n else " with different ids"))
        assert call["positions"] == list(range(n)), (
            f"{what}, step {t}: positions must be 0..{n - 1}, got {call['positions'][:5]}...")
        assert call["seq_lens"] == [n], (
            f"{what}, step {t}: the backend must be NoCacheBackend([{n}]), got seq_lens={call['seq_lens']}")


def tokens_processed(prompt_len: int, n_generated: int) -> int:
    """Σ over steps t = 0..n-1 of (Lp + t): what naive decode feeds the model in total."""
    return sum(prompt_len + t for t in range(n_generated))



def one_case_per_kind(cases: list[dict]) -> list[dict]:
    """One golden case of each kind (greedy, temperature, top_k, ...), each from a different prompt where possible.

    Full decodes are the slow tests, so they cover every sampler once rather than every case.  The hidden tests'
    SPECS pick their cases with the same rule, so this is that rule.
    """
    from autograder import hidden_outputs

    return importlib.reload(hidden_outputs).one_per_kind(cases)
