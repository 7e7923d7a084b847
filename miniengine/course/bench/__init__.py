"""Benchmarks that print tables of medians and ratios measured side by side in one run.

    python -m miniengine bench decode  [--prompt-tokens 32 --new-tokens 200 --runs 3]
    python -m miniengine bench batch   [--batches 1 4 16 64 --device cpu]   (needs the `hf` extra)
    python -m miniengine bench serve   [--requests 64 --rate 200 --seed 0 --shared-prefix 256]
    python -m miniengine bench chunked [--seeds 5 --sim-chunk 512 --cpu-chunk 64]
    python -m miniengine bench kv      [--requests 200 --kv-tokens 65536 --block-size 16 --max-tokens 2048]
    python -m miniengine bench spec    [--prompts 4 --new-tokens 64 --gammas 1 2 4 8]
    python -m miniengine bench quant   [--group-size 64 --new-tokens 128 --runs 3]
    python -m miniengine bench tp      [--batches 1 16 --steps 20 --repeats 3 --cases 40 --tp-size 8 --latency-us 10]
    python -m miniengine bench online  [--url URL --rates 2 4 8 16 --requests 48 --plot online.png]
    python -m miniengine bench gpu     [--batches 1 16 64 --context 512 --repeats 50 --new-tokens 256]   (CUDA only)

Speed claims live here, not in tests: this machine is shared and noisy, so a
ratio of medians taken in the same run is the number worth quoting.

One module per milestone, each with its verb's function and a ``register(sub)`` that adds the verb's flags;
:func:`add_arguments` registers them in the order ``bench --help`` lists them:

    verb      module              milestone
    decode    kv_cache            2  the KV cache (naive vs cached decode)
    batch     batching            4  batched decode against HF generate
    serve     serving             4  policies on a Poisson trace; 8 with --shared-prefix (prefix caching)
    chunked   chunked_prefill     8  chunked prefill against prefill-first
    kv        paged               5  contiguous against paged KV memory
    spec      speculative         6  speculative decoding
    quant     quantization        7  int8 and int4 weights
    tp        tensor_parallel     9  tensor parallelism
    online    online              10 a streaming client over HTTP against the same trace in-process
    gpu       gpu                 -  CUDA graphs against eager decode, on a GPU

The verbs' functions stay importable from here (``from miniengine.course import bench; bench.kv(args)``), as do
the inputs every benchmark shares (:mod:`.inputs`: ``bench_prompt``, ``batch_prompts``, ``warm_up``).
"""
from __future__ import annotations

from miniengine.course.bench import (batching, chunked_prefill, gpu, kv_cache, online, paged, quantization,
                                     serving, speculative, tensor_parallel)
from miniengine.course.bench.batching import batch
from miniengine.course.bench.chunked_prefill import chunked
from miniengine.course.bench.inputs import batch_prompts, bench_prompt, warm_up
from miniengine.course.bench.kv_cache import decode, time_decode
from miniengine.course.bench.paged import kv
from miniengine.course.bench.quantization import quant
from miniengine.course.bench.serving import decode_step_tok_s, serve, serve_shared_prefix
from miniengine.course.bench.speculative import DRAFTS, spec
from miniengine.course.bench.tensor_parallel import tp

__all__ = ["add_arguments", "VERBS", "bench_prompt", "batch_prompts", "warm_up", "time_decode", "decode", "batch",
           "decode_step_tok_s", "serve", "serve_shared_prefix", "chunked", "kv", "DRAFTS", "spec", "quant", "tp"]

# In the order of `bench --help`: the order the verbs were always listed in.
VERBS = (kv_cache, batching, serving, chunked_prefill, paged, speculative, quantization, tensor_parallel, online, gpu)


def add_arguments(p) -> None:
    """The ``bench`` sub-commands, each dispatched to its module (``args.func``)."""
    sub = p.add_subparsers(dest="bench", required=True)
    for module in VERBS:
        module.register(sub)
