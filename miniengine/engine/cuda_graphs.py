"""Decode steps replayed as CUDA graphs: the launch overhead of a small model's decode step, paid once.

A decode step of the course's tiny model issues a few hundred small kernels; on a GPU each launch costs
microseconds, more than the kernel itself, so the step is launch-bound, not memory-bound (Lecture 03).
A CUDA graph records the whole step's kernels once and replays them with one launch
(``torch.cuda.CUDAGraph``, https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs), as nano-vllm and
vLLM do for decode.  A graph replays the same kernels on the same memory, so everything that changes
from step to step must live in static buffers, with static shapes:

* **Buckets.**  Graphs for the batch sizes in ``buckets`` (1, 2, 4, 8, 16, 32, ... up to ``max_num_seqs``).
  A batch of n runs in the smallest bucket b >= n; rows n .. b-1 repeat row 0 (its token, position and
  block table), so they write row 0's K/V, bit for bit, into row 0's slot, and their logits are dropped.
* **Static KV metadata.**  ``block_tables`` [b, max_blocks] and ``context_lens`` [b]: every row gathers the
  keys of the first ``kb`` blocks of its table, and a mask hides the ones past its context, so the gather's
  shape never depends on the step.  ``kb`` is a second bucket, of table lengths (256 keys' worth of blocks,
  doubling up to the longest table): one graph per (batch bucket, key bucket), so that a step at a short
  context does not read the history a long one would.
* Prefills, mixed steps, batches larger than the largest bucket, and KV layouts or gathers other than
  the course's paged ones stay eager.

On CUDA the engine captures every bucket at start-up (the captures' writes land in slot 0, which is put
back afterwards), unless ``LLM(enforce_eager=True)``, vLLM's name; a capture that fails leaves the engine
eager, with a warning.  Without CUDA, ``DecodeGraphs(..., capture=False)`` runs the same static, padded step eagerly,
and the CPU tests also run ``capture()`` itself against a stand-in for ``torch.cuda.CUDAGraph`` that records the
step's tensor operations once and replays only them (``tests/engine/cuda_graph_emulation.py``): both are held to
the golden tokens.
"""
from __future__ import annotations

import numpy as np
import torch

from miniengine.attention import attention
from miniengine.kv.block_manager import blocks_needed
from miniengine.kv.paged import PagedKV, block_table_tensor, gather_history


def default_buckets(max_batch: int) -> tuple[int, ...]:
    """Powers of two below ``max_batch``, then ``max_batch`` itself: (1, 2, 4, ..., max_batch)."""
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return tuple(out + [max_batch])


def bucket_for(n: int, buckets) -> int | None:
    """The smallest bucket that holds ``n`` sequences, or None when none does (the step runs eagerly)."""
    return next((b for b in buckets if b >= n), None)


def default_key_buckets(max_blocks: int, block_size: int, smallest_keys: int = 256) -> tuple[int, ...]:
    """Table lengths, in blocks, to capture: enough blocks for 256 keys, doubling, then ``max_blocks``."""
    out, kb = [], max(1, blocks_needed(smallest_keys, block_size))
    while kb < max_blocks:
        out.append(kb)
        kb *= 2
    return tuple(out + [max_blocks])


def supports(kv) -> bool:
    """Graphs need the course's paged pool and its gather: a plugged-in layout or gather stays eager."""
    return isinstance(kv, PagedKV) and kv.gather is gather_history


class StaticDecodeBackend:
    """Attention for one decode token per row, reading only ``DecodeGraphs``' static buffers."""

    def __init__(self, graphs: "DecodeGraphs", bucket: int, key_blocks: int):
        kv, bs = graphs.kv, graphs.kv.block_size
        self.kv, self.bucket = kv, bucket
        self.tables = graphs.block_tables[:bucket, :key_blocks]
        pos = graphs.positions[:bucket]
        self.slot_mapping = self.tables.gather(1, (pos // bs)[:, None])[:, 0] * bs + pos % bs
        self.num_keys = key_blocks * bs
        keys = torch.arange(self.num_keys, device=pos.device)
        self.visible = (keys[None, :] < graphs.context_lens[:bucket, None])[:, None, :]  # [b, 1, num_keys]

    def attend(self, layer, q, k, v):
        kc, vc = self.kv.pool_k[layer], self.kv.pool_v[layer]
        kc.index_copy_(0, self.slot_mapping, k)
        vc.index_copy_(0, self.slot_mapping, v)
        shape = (self.kv.num_blocks, self.kv.block_size, *kc.shape[1:])
        hist_k = gather_history(kc.view(shape), self.tables, self.num_keys)
        hist_v = gather_history(vc.view(shape), self.tables, self.num_keys)
        return attention(q[:, None], hist_k, hist_v, self.visible)[:, 0]

    def advance(self) -> None:
        pass


class DecodeGraphs:
    """Static buffers, one captured graph per (batch bucket, key bucket), and the padded decode step.

    ``capture=None`` captures on CUDA and runs eagerly elsewhere.  ``steps`` counts the steps run per batch
    bucket, ``key_steps`` per key bucket, and ``padded_rows`` the rows added to fill the batches.
    """

    def __init__(self, model, kv: PagedKV, buckets=(1,), capture: bool | None = None, key_buckets=None):
        if not supports(kv):
            raise ValueError("decode graphs need the course's PagedKV with its own gather (a static-shape gather)")
        self.model, self.kv = model, kv
        self.buckets = tuple(sorted({int(b) for b in buckets}))
        if not self.buckets or self.buckets[0] < 1:
            raise ValueError(f"buckets must be integers >= 1, got {buckets!r}")
        cfg, device = model.config, kv.pool_k.device
        self.max_blocks = min(kv.num_blocks, blocks_needed(cfg.max_position_embeddings, kv.block_size))
        kbs = default_key_buckets(self.max_blocks, kv.block_size) if key_buckets is None else key_buckets
        self.key_buckets = tuple(sorted({min(int(k), self.max_blocks) for k in kbs} | {self.max_blocks}))
        if self.key_buckets[0] < 1:
            raise ValueError(f"key_buckets must be block counts >= 1, got {key_buckets!r}")
        top = self.buckets[-1]
        # Input ids, positions and context lengths share one buffer, so a step sends them in one copy.
        self.step_meta = torch.zeros(3, top, dtype=torch.long, device=device)
        self.input_ids, self.positions, self.context_lens = self.step_meta.unbind(0)
        self.context_lens.fill_(1)  # until the first step: position 0 of block 0, the slot the captures write
        self.block_tables = torch.zeros(top, self.max_blocks, dtype=torch.long, device=device)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (batch bucket, key bucket) -> graph
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self._reset_counts()
        if capture is None:
            capture = device.type == "cuda"
        if capture:
            self.capture()

    def _reset_counts(self) -> None:
        self.steps = {b: 0 for b in self.buckets}
        self.key_steps = {k: 0 for k in self.key_buckets}
        self.padded_rows = 0

    def accepts(self, batch) -> bool:
        """A step of decodes only (one new token each, whole sequences), no larger than the largest bucket."""
        return (len(batch.seqs) <= self.buckets[-1] and all(n == 1 for n in batch.num_new_tokens)
                and not batch.draft_token_ids and not any(batch.partial(i) for i in range(len(batch.seqs))))

    def prepare(self, seqs) -> tuple[int, int]:
        """Copy the step's inputs into the static buffers, padded to the bucket with copies of row 0; returns
        (batch bucket, key bucket)."""
        n = len(seqs)
        bucket = bucket_for(n, self.buckets)
        if bucket is None:
            raise ValueError(f"{n} sequences do not fit the largest bucket ({self.buckets[-1]})")
        tables = [self.kv.table(s) for s in seqs]
        width = max(len(t) for t in tables)
        if width > self.max_blocks:
            raise ValueError(f"a block table of {width} blocks is longer than the graphs' {self.max_blocks}")
        key_blocks = bucket_for(width, self.key_buckets)
        pos = [s.num_cached_tokens for s in seqs]
        ids = [s.token_ids[p] for s, p in zip(seqs, pos)]
        pad = bucket - n
        ids, pos, tables = ids + ids[:1] * pad, pos + pos[:1] * pad, tables + tables[:1] * pad
        # Two host-to-device copies, into the memory the graph reads; the graph for key_blocks reads only
        # the first key_blocks columns of the tables, so only those are sent.
        meta = np.array([ids, pos, [p + 1 for p in pos]], dtype=np.int64)  # numpy: see block_table_tensor
        self.step_meta[:, :bucket].copy_(torch.from_numpy(meta), non_blocking=True)
        self.block_tables[:bucket, :key_blocks].copy_(block_table_tensor(tables, key_blocks), non_blocking=True)
        self.steps[bucket] += 1
        self.key_steps[key_blocks] += 1
        self.padded_rows += pad
        return bucket, key_blocks

    def forward(self, bucket: int, key_blocks: int) -> torch.Tensor:
        """The padded step, eagerly: logits [bucket, vocab], from the static buffers."""
        backend = StaticDecodeBackend(self, bucket, key_blocks)
        return self.model(self.input_ids[:bucket], self.positions[:bucket], backend)

    @torch.inference_mode()
    def run(self, seqs) -> torch.Tensor:
        """Logits [len(seqs), vocab] of one decode step: a graph replay where one was captured."""
        key = self.prepare(seqs)
        if key in self.graphs:
            self.graphs[key].replay()
            return self.outputs[key][:len(seqs)]
        return self.forward(*key)[:len(seqs)]

    @torch.inference_mode()
    def capture(self) -> None:
        """Record one graph per bucket, largest first, all in one memory pool (PyTorch's CUDA-graph notes)."""
        # The warm-ups and captures run on the zeroed buffers, which write K/V into slot 0: put it back after.
        saved = self.kv.pool_k[:, 0].clone(), self.kv.pool_v[:, 0].clone()
        try:
            pool = None
            for key in sorted(((b, k) for b in self.buckets for k in self.key_buckets), reverse=True):
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # warm-up off the capture: lazy initialisation must not be recorded
                    for _ in range(2):
                        self.forward(*key)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[key] = self.forward(*key)
                pool = graph.pool()
                self.graphs[key] = graph
            torch.cuda.synchronize()
        finally:
            self.kv.pool_k[:, 0].copy_(saved[0])
            self.kv.pool_v[:, 0].copy_(saved[1])
            self._reset_counts()
