"""EngineConfig: everything that shapes an engine, checked once, with messages that name the field."""
from __future__ import annotations

import dataclasses
import numbers

import torch

from miniengine import plugs
from miniengine.plugs.conformance import check, check_speculative_kv

DTYPES = {"float32": torch.float32, "float64": torch.float64}
KV_LAYOUTS = ("paged", "contiguous")


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclasses.dataclass
class EngineConfig:
    """The model, its precision and device, the step budgets, the KV memory, and the plug points.

    Plug points: ``sampler``, ``kv``, ``scheduling_policy``, ``enable_chunked_prefill`` (a rule),
    ``speculative_verifier`` and ``quantization`` (a scheme) take an object of your own; None (or a string, or
    True) means the course's own part.  Each interface is declared once, as a Protocol with its lab and default,
    in miniengine/plugs/__init__.py (``PLUG_POINTS``), and a plugged object is checked against it here, with a message
    that names the field, the missing method and the lab.
    """

    model: object = "data/models/target"  # a directory (or a shipped model's name), or a loaded Llama
    dtype: str = "float32"
    device: str = "cpu"
    max_num_seqs: int = 64               # sequences in one step
    max_num_batched_tokens: int = 4096   # tokens in one step (prefill tokens + one per decode)
    kv_cache_tokens: int = 16384         # positions of K/V the cache holds, all sequences together
    kv_layout: str = "paged"             # "paged": blocks on demand (milestone 5); "contiguous": reserve up front
    block_size: int = 16                 # positions per KV block (paged layout): kv_cache_tokens // block_size blocks
    enable_prefix_caching: bool = False  # paged layout: full blocks are kept, keyed by their prefix, and reused
    # Chunked prefill: a long prompt is fed over several steps, beside the running decodes, in chunks that fit
    # max_num_batched_tokens; True (as much as fits), or a function chunk(seq, tokens_left) -> int (Lab 08).
    enable_chunked_prefill: object = False
    sampler: object = None
    kv: object = None
    scheduling_policy: object = None
    # Speculative decoding (milestone 6): a draft model (a directory, a shipped model's name, or a loaded Llama)
    # drafts num_speculative_tokens tokens per step; the verifier is "coupled" (the same tokens as plain
    # decoding), "rejection" (rejection sampling: the same distribution), or a function with
    # spec.verify.rejection_verify's signature (Lab 06), which gets the draft's distributions.
    speculative_model: object = None
    num_speculative_tokens: int = 0
    speculative_verifier: str = "coupled"
    # Weight-only quantization (milestone 7): "int8" (per output channel), "int4" (groups of quant_group_size,
    # packed two to a byte), or a scheme object with quantize(weight) and dequantize(state) (Lab 07).
    quantization: object = None
    quant_group_size: int = 64
    # What an OpenAI client's sampling fields need (Lab 10): the row processor for penalties and min_p (a function with
    # logits_processors.process_row's signature) and the stop strings (an object with find_stop and sendable, as
    # miniengine/stop_strings.py has); None means the course's.
    logits_processor: object = None
    stop_strings: object = None
    # On CUDA, decode steps are captured once per batch-size bucket and replayed as CUDA graphs
    # (engine/cuda_graphs.py); True keeps every step eager (vLLM's name). Without CUDA every step is eager.
    enforce_eager: bool = False

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "kv_cache_tokens", "block_size"):
            _positive_int(name, getattr(self, name))
        if self.kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {list(KV_LAYOUTS)}, got {self.kv_layout!r}")
        if self.kv_layout == "paged" and self.kv_cache_tokens < self.block_size:
            raise ValueError(f"kv_cache_tokens must be >= block_size={self.block_size} (at least one block), "
                             f"got {self.kv_cache_tokens}")
        if not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager must be True or False, got {self.enforce_eager!r}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching must be True or False, got {self.enable_prefix_caching!r}")
        if self.enable_prefix_caching and (self.kv_layout != "paged" or self.kv is not None):
            raise ValueError("enable_prefix_caching=True needs the course's paged KV layout (kv_layout='paged', kv=None): "
                             "it reuses whole blocks of the pool")
        chunk = self.enable_chunked_prefill
        if not (isinstance(chunk, bool) or callable(chunk)):
            raise ValueError(f"enable_chunked_prefill must be True, False or a function chunk(seq, tokens_left) -> int, "
                             f"got {chunk!r}")
        if chunk is not False and self.speculative_model is not None:
            raise ValueError("enable_chunked_prefill cannot be combined with a speculative_model: the speculative "
                             "step verifies whole prefills")
        if self.speculative_model is not None:
            _positive_int("num_speculative_tokens", self.num_speculative_tokens)
            if not callable(self.speculative_verifier) and self.speculative_verifier not in ("coupled", "rejection"):
                raise ValueError(f"speculative_verifier must be 'coupled', 'rejection' or a function verify(target_logits, "
                                 f"drafts, draft_probs, params, positions), got {self.speculative_verifier!r}")
            if self.sampler is not None:
                raise ValueError("sampler must be None with a speculative_model: the verifiers sample with the course's "
                                 "keyed sampler, which the draft's tokens are checked against")
        elif self.num_speculative_tokens:
            raise ValueError(f"num_speculative_tokens={self.num_speculative_tokens!r} needs a speculative_model "
                             f"(a draft model), got none")
        if self.quantization is not None:
            from miniengine.layers.quant import get_scheme
            get_scheme(self.quantization, self.quant_group_size)  # a bad name, group size or scheme fails here, named
        self._check_plugs()

    def _check_plugs(self):
        """Every plugged object against its Protocol (miniengine/plugs/__init__.py)."""
        if self.sampler is not None:
            check("sampler", self.sampler, plugs.BatchSampler)
        if self.scheduling_policy is not None:
            check("scheduling_policy", self.scheduling_policy, plugs.SchedulingPolicy)
        if callable(self.enable_chunked_prefill):
            check("enable_chunked_prefill", self.enable_chunked_prefill, plugs.ChunkingRule)
        if self.speculative_model is not None and callable(self.speculative_verifier):
            check("speculative_verifier", self.speculative_verifier, plugs.Verifier)
        if self.logits_processor is not None:
            check("logits_processor", self.logits_processor, plugs.LogitsProcessor)
        if self.stop_strings is not None:
            check("stop_strings", self.stop_strings, plugs.StopStrings)
        if self.kv is not None:
            check("kv", self.kv, plugs.KVLayout)
            if hasattr(self.kv, "can_append") or hasattr(self.kv, "append_slot"):
                check("kv", self.kv, plugs.GrowingKVLayout)
            if self.speculative_model is not None:
                check_speculative_kv(self.kv)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
