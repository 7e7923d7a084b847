"""What the benchmarks feed the engine: prompts cut from the validation code, and one warm-up request."""
from __future__ import annotations

from miniengine.course import corpus
from miniengine.sampling import SamplingParams


def bench_prompt(tok, n_tokens: int) -> list[int]:
    """The first ``n_tokens`` of the first validation file: real code the model did not train on."""
    _, val = corpus.split_files()
    return tok.encode(val[0].read_text()).ids[:n_tokens]


def batch_prompts(tok, n_prompts: int, n_tokens: int) -> list[list[int]]:
    """n different prompts of exactly n_tokens each (consecutive windows of validation code), so HF needs no padding."""
    _, val = corpus.split_files()
    ids = [t for f in val[:8] for t in tok.encode(f.read_text()).ids]
    return [ids[i * n_tokens:(i + 1) * n_tokens] for i in range(n_prompts)]


def warm_up(engine) -> None:
    """One tiny request before the timed replay: first-call costs stay out of the measurement (and its three tokens
    share no KV block with any trace)."""
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()
