"""Decode steps as CUDA graphs (miniengine/engine/cuda_graphs.py): what the CPU can check.

The graph capture itself needs CUDA (`make gpu-check` runs the golden cases with graphs there).  Everything
around it is the same code on the CPU with ``capture=False``: the buckets, the padding, the static buffers and
the static-shape attention, held here to the golden tokens at every bucket.

The capture is checked too, with a stand-in for ``torch.cuda.CUDAGraph`` (``tests/engine/cuda_graph_emulation.py``): the
engine's own ``capture()`` records each bucket's step once, refusing what a real capture refuses (host reads
such as ``.item()``), and every later step replays the recorded ops with no Python in between, so a value
frozen at capture shows up as a wrong token.
"""
from __future__ import annotations

import pytest
import torch
from cuda_graph_emulation import CaptureError, ReplayGraph, emulate_cuda_graphs, emulated_graph

from miniengine import LLM, SamplingParams
from miniengine.config import EngineConfig
from miniengine.engine import LLMEngine
from miniengine.engine.cuda_graphs import DecodeGraphs, bucket_for, default_buckets, default_key_buckets, supports
from miniengine.kv import PagedKV

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


def params_of(case):
    return SamplingParams(**case["params"])


def graphed_engine(model, max_num_seqs, buckets, keep_logits=False, **config):
    engine = LLMEngine(EngineConfig(model=model, max_num_seqs=max_num_seqs, **config), keep_logits=keep_logits)
    engine.runner.graphs = DecodeGraphs(engine.model, engine.kv, buckets, capture=False)
    return engine


def serve(engine, cases, lengths=None):
    params = [params_of(c) for c in cases]
    if lengths is not None:
        params = [SamplingParams(**{**c["params"], "max_tokens": n}) for c, n in zip(cases, lengths)]
    seqs = [engine.add_request(c["prompt_token_ids"], p) for c, p in zip(cases, params)]
    while engine.has_unfinished_requests():
        engine.step()
    return seqs


def staggered(cases):
    """Output lengths 1 to 16 in turn (one case alone at 16): the batch thins out through every size.

    A shorter max_tokens keeps the golden run's first tokens (greedy, or noise keyed by seed and position)."""
    lengths = [1 + i % 16 for i in range(len(cases))]
    lengths[15] = 15
    return lengths


def test_buckets_are_powers_of_two_then_the_batch_limit():
    assert default_buckets(1) == (1,)
    assert default_buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert default_buckets(48) == (1, 2, 4, 8, 16, 32, 48)
    assert [bucket_for(n, (1, 2, 4, 8)) for n in range(1, 10)] == [1, 2, 4, 4, 8, 8, 8, 8, None]
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match=r"max_batch must be an integer >= 1"):
            default_buckets(bad)
    # table lengths in blocks: 256 keys' worth, doubling, then the longest table
    assert default_key_buckets(256, 16) == (16, 32, 64, 128, 256)
    assert default_key_buckets(40, 16) == (16, 32, 40)
    assert default_key_buckets(8, 64) == (4, 8)


@pytest.mark.parametrize("replay", [False, True])
def test_a_step_reads_only_its_key_bucket_s_history(target, golden, monkeypatch, replay):
    """Key buckets of 2, 4 and 8 blocks of 8 positions: short contexts use the short graphs, long ones the long.
    With ``replay``, each bucket's step is captured once and replayed (cuda_graph_emulation, below)."""
    if replay:
        emulate_cuda_graphs(monkeypatch)
    engine = graphed_engine(target, 4, (1, 2, 4), block_size=8)
    engine.runner.graphs = DecodeGraphs(engine.model, engine.kv, (1, 2, 4), capture=replay, key_buckets=(2, 4, 8))
    long_case = max(golden["cases"], key=lambda c: len(c["prompt_token_ids"]))
    cases = golden["cases"][:3] + [long_case]
    for c, s in zip(cases, serve(engine, cases)):
        assert s.output_token_ids == c["token_ids"], c["name"]
    graphs = engine.runner.graphs
    assert graphs.key_buckets[:3] == (2, 4, 8) and graphs.key_buckets[-1] == graphs.max_blocks
    used = [k for k, n in graphs.key_steps.items() if n]
    assert len(used) >= 2, graphs.key_steps
    if replay:
        assert {k for (_, k), g in graphs.graphs.items() if g.replays} == set(used)


@pytest.mark.parametrize("max_num_seqs,buckets,config", [
    (40, default_buckets(40), {}),                                   # 40 decodes thinning out: every bucket
    (7, (1, 2, 4, 8), dict(kv_cache_tokens=512, block_size=8)),      # a small pool: preemption, tables rebuilt
    (3, (4,), {}),                                                   # one bucket: every step padded
])
def test_padded_static_decode_gives_the_golden_tokens_at_every_bucket(target, golden, max_num_seqs, buckets, config):
    cases = golden["cases"]
    engine = graphed_engine(target, max_num_seqs, buckets, **config)
    lengths = staggered(cases)
    seqs = serve(engine, cases, lengths)
    for c, s, n in zip(cases, seqs, lengths):
        assert s.output_token_ids == c["token_ids"][:n], c["name"]
    graphs = engine.runner.graphs
    assert sum(graphs.steps.values()) >= 10 and graphs.padded_rows > 0, graphs.steps


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_each_bucket_serves_its_batch_sizes_exactly(target, golden, n):
    """n requests decode together from their first decode step on, in bucket_for(n), padded with n - bucket rows."""
    buckets = (1, 2, 4, 8)
    cases = golden["cases"][5 * n % 40:][:n]
    engine = graphed_engine(target, n, buckets)
    for c, s in zip(cases, serve(engine, cases)):
        assert s.output_token_ids == c["token_ids"], c["name"]
    graphs = engine.runner.graphs
    assert graphs.steps[bucket_for(n, buckets)] > 0, graphs.steps
    assert (graphs.padded_rows > 0) == (n not in buckets)


@pytest.mark.parametrize("replay", [False, True])
def test_the_static_step_s_logits_match_the_eager_step_s(target, golden, monkeypatch, replay):
    """The static gather reads the whole table's worth of keys and masks the rest: last-bit differences only.
    With ``replay``, the logits kept are copies, not views of the graph's output that the next replay overwrites."""
    cases = golden["cases"][:12]
    eager = LLMEngine(EngineConfig(model=target, max_num_seqs=12), keep_logits=True)
    static = graphed_engine(target, 12, default_buckets(12), keep_logits=True)
    if replay:
        emulate_cuda_graphs(monkeypatch)
        static.runner.graphs = DecodeGraphs(static.model, static.kv, default_buckets(12), capture=True)
    for a, b in zip(serve(eager, cases), serve(static, cases)):
        assert a.output_token_ids == b.output_token_ids
        diff = max((x - y).abs().max().item() for x, y in zip(a.logits, b.logits))
        assert diff < 1e-4
    if replay:
        assert sum(g.replays for g in static.runner.graphs.graphs.values()) > 0


def test_padding_repeats_row_0_so_its_writes_are_row_0_s(target):
    from miniengine.course.gpu_check import three_decodes

    engine = graphed_engine(target, 8, (1, 4, 8))
    seqs = three_decodes(engine)
    graphs = engine.runner.graphs
    assert graphs.prepare(seqs) == (4, graphs.key_buckets[0])
    for name in ("input_ids", "positions", "context_lens", "block_tables"):
        buf = getattr(graphs, name)
        assert torch.equal(buf[3], buf[0]), name
    assert graphs.positions[:3].tolist() == [s.num_cached_tokens for s in seqs]
    assert graphs.input_ids[:3].tolist() == [s.token_ids[-1] for s in seqs]
    assert (graphs.context_lens[:3] == graphs.positions[:3] + 1).all()
    assert graphs.padded_rows == 1


def test_what_stays_eager(target):
    model = LLM(model=target).engine.model
    assert LLM(model=target).engine.runner.graphs is None  # no CUDA here: every step eager
    assert not supports(LLMEngine(EngineConfig(model=model, kv_layout="contiguous")).kv)
    custom = PagedKV(model.config, 32, 16, gather=lambda cache, tables, n: None)
    assert not supports(custom)
    with pytest.raises(ValueError, match=r"decode graphs need the course's PagedKV with its own gather"):
        DecodeGraphs(model, custom, (1, 2))
    with pytest.raises(ValueError, match=r"enforce_eager must be True or False, got 'yes'"):
        EngineConfig(enforce_eager="yes")


def test_bench_gpu_says_it_needs_cuda_and_checks_its_flags(capsys):
    from miniengine.__main__ import main

    assert main(["bench", "gpu"]) == 1
    assert "no CUDA device is visible here" in capsys.readouterr().out
    assert main(["bench", "gpu", "--batches", "1", "0"]) == 2
    assert "--batches must be >= 1, got 1 0" in capsys.readouterr().err


def test_only_the_exact_products_in_the_gpu_table_get_its_numbers():
    from miniengine.cost.roofline import GPUS, gpu_for_device

    assert gpu_for_device("NVIDIA H100 80GB HBM3") is GPUS["H100"]
    assert gpu_for_device("NVIDIA H200") is GPUS["H200"]
    assert gpu_for_device("Tesla T4") is GPUS["T4"]
    for other in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA A100-SXM4-40GB", "NVIDIA GeForce RTX 4090"):
        assert gpu_for_device(other) is None, other


# --- The capture itself, on the CPU: cuda_graph_emulation.ReplayGraph runs the captured step's ops, not its Python ---

def test_the_replay_stand_in_catches_what_a_real_capture_would():
    """The tool first: a replay reads the static buffers afresh, freezes Python values, and refuses host reads."""
    x, scale = torch.arange(4.0), 3
    g = ReplayGraph()
    with emulated_graph(g):
        y = x[1:] * scale + x.sum()
    x.copy_(torch.tensor([1.0, 1.0, 1.0, 1.0]))
    scale = 100  # a Python value: the graph keeps the 3 it saw
    g.replay()
    assert y.tolist() == [7.0, 7.0, 7.0] and g.replays == 1
    for bad, what in ((lambda: x[0].item(), r"\.item\(\)"), (lambda: bool(x[0] > 0), r"bool\(\) of a tensor"),
                      (lambda: x[x > 0], r"boolean mask"), (lambda: torch.tensor([1, 2]), r"torch\.tensor"),
                      (lambda: x.tolist(), r"\.tolist\(\)")):
        # under inference mode, as DecodeGraphs.capture runs (outside it .tolist() dispatches no op to catch)
        with pytest.raises(CaptureError, match=what), torch.inference_mode(), emulated_graph(ReplayGraph()):
            bad()


def captured_engine(model, max_num_seqs, buckets, monkeypatch, **config):
    emulate_cuda_graphs(monkeypatch)
    engine = LLMEngine(EngineConfig(model=model, max_num_seqs=max_num_seqs, **config))
    engine.runner.graphs = DecodeGraphs(engine.model, engine.kv, buckets, capture=True, key_buckets=(2,))
    return engine


@pytest.mark.parametrize("max_num_seqs,buckets,config", [
    (40, default_buckets(40), {}),                                   # 40 decodes thinning out: every bucket
    (7, (1, 2, 4, 8), dict(kv_cache_tokens=512, block_size=8)),      # a small pool: preemption, tables rebuilt
])
def test_replayed_graphs_give_the_golden_tokens(target, golden, monkeypatch, max_num_seqs, buckets, config):
    """DecodeGraphs' own capture() on the CPU: every decode step is a replay of ops recorded once per bucket."""
    engine = captured_engine(target, max_num_seqs, buckets, monkeypatch, **config)
    graphs = engine.runner.graphs
    assert set(graphs.graphs) == {(b, k) for b in graphs.buckets for k in graphs.key_buckets}
    cases, lengths = golden["cases"], staggered(golden["cases"])
    for c, s, n in zip(cases, serve(engine, cases, lengths), lengths):
        assert s.output_token_ids == c["token_ids"][:n], c["name"]
    replays = {key: g.replays for key, g in graphs.graphs.items() if g.replays}
    assert sum(replays.values()) == sum(graphs.steps.values()) >= 10 and graphs.padded_rows > 0, replays
    assert len({b for b, _ in replays}) >= 3, replays


def test_capture_puts_back_the_slot_it_writes(target, monkeypatch):
    """Captures run on zeroed buffers, so they write K/V into block 0's slot 0: a live sequence's K/V stays."""
    emulate_cuda_graphs(monkeypatch)
    engine = LLMEngine(EngineConfig(model=target, max_num_seqs=2))
    kv = engine.kv
    kv.pool_k.normal_(), kv.pool_v.normal_()
    before = kv.pool_k.clone(), kv.pool_v.clone()
    graphs = DecodeGraphs(engine.model, kv, (1, 2), capture=True)
    assert torch.equal(kv.pool_k, before[0]) and torch.equal(kv.pool_v, before[1])
    assert graphs.steps == {1: 0, 2: 0} and graphs.padded_rows == 0


def test_a_capture_that_fails_leaves_the_engine_eager_with_a_warning(target, golden, monkeypatch):
    emulate_cuda_graphs(monkeypatch)

    class Refused:
        def __init__(self, *a, **k):
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Refused)
    engine = LLMEngine(EngineConfig(model=target, max_num_seqs=4))
    engine.kv.pool_k.normal_()
    before = engine.kv.pool_k.clone()
    with pytest.warns(UserWarning, match=r"CUDA graph capture failed \(RuntimeError: operation not permitted when "
                      r"stream is capturing\); decoding eagerly\. LLM\(enforce_eager=True\) skips the attempt\."):
        assert engine._decode_graphs() is None
    assert torch.equal(engine.kv.pool_k, before)
    engine.kv.pool_k.zero_()
    cases = golden["cases"][:4]
    for c, s in zip(cases, serve(engine, cases)):
        assert s.output_token_ids == c["token_ids"], c["name"]


def test_gpu_check_s_padding_check_runs_here_on_replayed_graphs(target, monkeypatch):
    """gpu_check.padding_on_cuda, with the CPU and the replay stand-in in place of CUDA: its bookkeeping holds."""
    import miniengine.llm
    from miniengine.course import gpu_check

    emulate_cuda_graphs(monkeypatch)

    def on_cpu(device, **kwargs):
        llm = LLM(model=target, **kwargs)
        llm.engine.runner.graphs = llm.engine._decode_graphs()
        return llm

    monkeypatch.setattr(miniengine.llm, "LLM", on_cpu)
    assert gpu_check.padding_on_cuda() == "padding: the padded row's logits equal row 0's bit for bit"


def test_replayed_graphs_serve_forks_and_a_prefix_cache(target, golden, monkeypatch):
    """n=4 forks share their prompt's blocks, so their first decodes copy a shared block (copy-on-write, done by
    the scheduler's append_slot before the step); with a prefix cache, requests start on cached blocks.  Both
    reach the graphs as plain block tables."""
    emulate_cuda_graphs(monkeypatch)
    llm = LLM(model=target, max_num_seqs=16, block_size=8, enable_prefix_caching=True)
    graphs = llm.engine.runner.graphs = llm.engine._decode_graphs()
    forks = golden["fork_cases"]
    for _ in range(2):  # the second time round, the prompts' full blocks come from the prefix cache
        outs = llm.generate([c["prompt_token_ids"] for c in forks], [params_of(c) for c in forks])
        for out, c in zip(outs, forks):
            assert [o.token_ids for o in out.outputs] == [w["token_ids"] for w in c["completions"]], c["name"]
    assert llm.engine.kv.copies > 0 and llm.engine.kv.block_manager.hit_tokens > 0
    assert sum(g.replays for g in graphs.graphs.values()) == sum(graphs.steps.values()) > 0
