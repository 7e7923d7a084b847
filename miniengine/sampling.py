"""Sampling parameters and a batch-invariant sampler (miniengine/README.md, "Sampling").

The sampler is the Gumbel-max trick: adding independent Gumbel noise to the
(temperature-scaled, masked) logits and taking the argmax draws a token from
softmax(logits / T) exactly.  The noise for a token comes from a counter-based
RNG keyed by (request seed, absolute position of that token), not from a global
stream, so a request draws the same noise, and therefore the same tokens,
whether it runs alone or in any batch, in any order, on any device.
"""
from __future__ import annotations

import dataclasses
import numbers

import numpy as np


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and bool(np.isfinite(x))


# The most logprobs a request may ask for: vLLM's default max_logprobs, so a client written for it fits here.
MAX_LOGPROBS = 20


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """vLLM's field names.  temperature=0 means greedy; top_k=0 and top_p=1 mean off."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    seed: int = 0
    ignore_eos: bool = False
    n: int = 1  # completions of the prompt; child i samples with seed child_seed(seed, i)
    # What an OpenAI client sends (miniengine/logits_processors.py and miniengine/stop_strings.py say how each acts).
    stop: tuple[str, ...] = ()  # text that ends a completion; a str or a list is accepted and kept as a tuple
    stop_token_ids: tuple[int, ...] = ()  # token ids that end a completion (kept in token_ids, as end-of-text is)
    include_stop_str_in_output: bool = False
    repetition_penalty: float = 1.0  # > 0; 1 means off; over prompt and output tokens
    presence_penalty: float = 0.0  # in [-2, 2]; 0 means off; over output tokens
    frequency_penalty: float = 0.0  # in [-2, 2]; 0 means off; over output tokens
    min_p: float = 0.0  # in [0, 1]; 0 means off
    logprobs: int | None = None  # None: none returned; k: the chosen token's and the k most likely (k <= MAX_LOGPROBS)

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not np.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {t!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 means off), got {self.top_k!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not (0 < p <= 1):
            raise ValueError(f"top_p must be a number in (0, 1] (1 means off), got {p!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _is_int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        self._check_openai_fields()

    def _check_openai_fields(self):
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(x, str) and x for x in stop):
            raise ValueError(f"stop must be a non-empty string or a list of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(stop))  # frozen: hashable and safe to share between requests
        ids = self.stop_token_ids
        if not isinstance(ids, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in ids):
            raise ValueError(f"stop_token_ids must be a list of token ids (integers >= 0), got {ids!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in ids))
        if not isinstance(self.include_stop_str_in_output, bool):
            raise ValueError(f"include_stop_str_in_output must be true or false, got {self.include_stop_str_in_output!r}")
        r = self.repetition_penalty
        if not _is_real(r) or not r > 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 means off), got {r!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_real(v) or not -2 <= v <= 2:
                raise ValueError(f"{name} must be a number in [-2, 2] (0 means off), got {v!r}")
        if not _is_real(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be a number in [0, 1] (0 means off), got {self.min_p!r}")
        k = self.logprobs
        if k is not None and (not _is_int(k) or not 0 <= k <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}] or None, got {k!r}")

    @property
    def processes_logits(self) -> bool:
        """Does anything change the logits before the sampler (penalties, min_p)?"""
        return (self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.min_p > 0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def child_seed(seed: int, index: int) -> int:
    """The sampling seed of completion ``index`` of a request with ``n`` > 1 completions.

    Child 0 keeps the request's own seed, so it is exactly what ``n=1`` returns.
    Child i > 0 takes the first 64-bit word of numpy's ``SeedSequence([seed mod 2**64, i])``:
    a documented hash, so that children differ from each other and from
    neighbouring seeds, and any implementation can derive the same keys.
    """
    if index == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, int(index)]).generate_state(1, np.uint64)[0])


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """The params completion ``index`` samples with: its own seed, n=1."""
    return dataclasses.replace(params, seed=child_seed(params.seed, index), n=1)


# Independent keyed streams for one (seed, position).  The sampler uses stream 0; speculative sampling's
# rejection verifier draws its draft tokens, its accept/reject coins and its residual samples from the others,
# so that none of them reuses the target sampler's numbers.
STREAM_SAMPLE, STREAM_DRAFT, STREAM_ACCEPT, STREAM_RESIDUAL = 0, 1, 2, 3


def keyed_uniform(seed: int, position: int, size: int, stream: int = STREAM_SAMPLE) -> np.ndarray:
    """Uniform [0, 1) numbers keyed by (seed, absolute position, stream).

    Philox is a counter-based generator: the key alone fixes the stream, so no
    state is shared between requests or carried from one step to the next.
    Streams start at counters 2**64 apart, so they never overlap.
    """
    key = np.array([int(seed) & 0xFFFFFFFFFFFFFFFF, int(position)], dtype=np.uint64)
    counter = np.array([0, int(stream), 0, 0], dtype=np.uint64)
    return np.random.Generator(np.random.Philox(key=key, counter=counter)).random(size)


def gumbel_noise(seed: int, position: int, vocab_size: int, stream: int = STREAM_SAMPLE) -> np.ndarray:
    """Gumbel(0, 1) noise for one token, keyed by (seed, absolute position) (and a stream, see above)."""
    u = np.clip(keyed_uniform(seed, position, vocab_size, stream), np.finfo(np.float64).tiny, 1.0)  # never exactly 0
    return -np.log(-np.log(u))


def top_k_mask(logits: np.ndarray, k: int) -> np.ndarray:
    """True for the tokens kept: the k largest logits (ties at the k-th value are all kept)."""
    if k <= 0 or k >= logits.size:
        return np.ones(logits.shape, dtype=bool)
    kth = np.partition(logits, -k)[-k]
    return logits >= kth


def top_p_mask(logits: np.ndarray, p: float) -> np.ndarray:
    """True for the nucleus: the most probable tokens whose probabilities first add up to >= p.

    A token is kept when the probability mass strictly before it (in descending
    order) is still below p, so the most likely token is always kept.
    """
    if p >= 1.0:
        return np.ones(logits.shape, dtype=bool)
    probs = softmax(logits)
    order = np.argsort(-probs, kind="stable")
    mass_before = np.cumsum(probs[order]) - probs[order]
    keep = np.zeros(logits.shape, dtype=bool)
    keep[order[mass_before < p]] = True
    return keep


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - np.max(x))
    return z / z.sum()


def processed_logits(logits, params: SamplingParams) -> np.ndarray:
    """Temperature, then top-k, then top-p (vLLM's order); masked tokens get -inf."""
    scaled = np.asarray(logits, dtype=np.float64) / params.temperature
    scaled = np.where(top_k_mask(scaled, params.top_k), scaled, -np.inf)
    return np.where(top_p_mask(scaled, params.top_p), scaled, -np.inf)


def sample_token(logits, params: SamplingParams, position: int) -> int:
    """The token at absolute ``position``, from the logits that predict it."""
    logits = np.asarray(logits, dtype=np.float64)
    if params.greedy:
        return int(np.argmax(logits))
    scores = processed_logits(logits, params) + gumbel_noise(params.seed, position, logits.size)
    return int(np.argmax(scores))
