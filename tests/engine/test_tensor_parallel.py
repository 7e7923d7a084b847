"""Tensor parallelism (Megatron-style): shard shapes, the split's algebra in one process, bad world sizes,
two gloo ranks token-exact on golden cases, and the cost model's all-reduce formula by hand."""
import json

import pytest
import torch
from conftest import tiny_config

from miniengine import LLM
from miniengine.attention import NoCacheBackend
from miniengine.config import EngineConfig
from miniengine.cost.roofline import GPUS, CostModel, Interconnect, llama3_70b, ring_allreduce_s, tensor_parallel_decode
from miniengine.course.tp_reference import tp_reference_generate
from miniengine.distributed import (ColumnParallelLinear, Plan, RowParallelLinear, ThreadRing, check_world_size,
                                    rank_kv_shape, ring_all_reduce, row_shard, shard_model, tp_generate)
from miniengine.engine import LLMEngine
from miniengine.model import Llama, load_model
from miniengine.paths import GOLDEN, MODELS
from miniengine.reference import naive_generate
from miniengine.sampling import SamplingParams

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


def params_of(case):
    return SamplingParams(**case["params"])


# ------------------------------------------------------------------ sharding, in one process

def test_shards_are_slices_that_put_the_full_weights_back_together(tiny_gqa):
    """tiny_gqa: 4 query heads, 2 KV heads, head_dim 8, MLP width 64; two ranks."""
    shards = [shard_model(tiny_gqa, r, 2) for r in range(2)]
    for i, full in enumerate(tiny_gqa.model.layers):
        parts = [s.model.layers[i] for s in shards]
        for name, dim in (("q_proj", 0), ("k_proj", 0), ("v_proj", 0), ("o_proj", 1)):
            ws = [getattr(p.self_attn, name).weight for p in parts]
            assert ws[0].shape[dim] == getattr(full.self_attn, name).weight.shape[dim] // 2
            assert torch.equal(torch.cat(ws, dim), getattr(full.self_attn, name).weight)
        for name, dim in (("gate_proj", 0), ("up_proj", 0), ("down_proj", 1)):
            ws = [getattr(p.mlp, name).weight for p in parts]
            assert torch.equal(torch.cat(ws, dim), getattr(full.mlp, name).weight)
        assert isinstance(parts[0].self_attn.q_proj, ColumnParallelLinear)
        assert isinstance(parts[0].self_attn.o_proj, RowParallelLinear)
        assert isinstance(parts[0].mlp.down_proj, RowParallelLinear)
        assert (parts[0].self_attn.n_heads, parts[0].self_attn.n_kv, parts[0].self_attn.head_dim) == (2, 1, 8)
    for s in shards:  # replicated, whole
        assert torch.equal(s.model.embed_tokens.weight, tiny_gqa.model.embed_tokens.weight)
        assert torch.equal(s.lm_head.weight, tiny_gqa.lm_head.weight)
        assert torch.equal(s.model.norm.weight, tiny_gqa.model.norm.weight)
    assert isinstance(tiny_gqa.model.layers[0].self_attn.q_proj, torch.nn.Linear)  # the original is untouched
    kv = rank_kv_shape(tiny_gqa.config, 2)
    assert (kv.num_hidden_layers, kv.num_key_value_heads, kv.head_dim) == (2, 1, 8)


@torch.no_grad()
def test_the_ranks_partial_outputs_sum_to_each_full_block(tiny_gqa):
    """Megatron's identity, with the all-reduce done by hand: each block's output is the sum of the ranks'."""
    model = tiny_gqa.double()
    shards = [shard_model(model, r, 2) for r in range(2)]
    for s in shards:
        for m in s.modules():
            if isinstance(m, RowParallelLinear):
                m.world_size = 1  # skip the collective: we add the partial sums ourselves
    torch.manual_seed(1)
    x = torch.randn(5, model.config.hidden_size, dtype=torch.float64)
    cos, sin = model.rope_tables(x.dtype, x.device)
    cos, sin = cos[torch.arange(5)], sin[torch.arange(5)]
    for i, layer in enumerate(model.model.layers):
        attn = sum(s.model.layers[i].self_attn(x, cos, sin, NoCacheBackend([5])) for s in shards)
        torch.testing.assert_close(attn, layer.self_attn(x, cos, sin, NoCacheBackend([5])), rtol=0, atol=1e-12)
        mlp = sum(s.model.layers[i].mlp(x) for s in shards)
        torch.testing.assert_close(mlp, layer.mlp(x), rtol=0, atol=1e-12)


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("fields,world_size,message", [
    (dict(num_attention_heads=4, num_key_value_heads=4), 3,
     r"world_size=3 must divide num_attention_heads=4 .*allowed world sizes for this model: 1, 2, 4$"),
    (dict(num_attention_heads=4, num_key_value_heads=2), 4,
     r"world_size=4 must divide num_key_value_heads=2 .*allowed world sizes for this model: 1, 2$"),
    (dict(num_attention_heads=4, num_key_value_heads=4, intermediate_size=66), 4,
     r"world_size=4 must divide intermediate_size=66 .*allowed world sizes for this model: 1, 2$"),
    (dict(), 0, r"world_size must be an integer >= 1, got 0"),
    (dict(), 2.0, r"world_size must be an integer >= 1, got 2.0"),
    (dict(), True, r"world_size must be an integer >= 1, got True"),
])
def test_a_world_size_that_does_not_split_the_model_evenly_is_named(fields, world_size, message):
    cfg = tiny_config(**fields)
    with pytest.raises(ValueError, match=message):
        check_world_size(cfg, world_size)
    with pytest.raises(ValueError, match=message):
        shard_model(Llama(cfg), 0, world_size)


def test_bad_rank_quantized_layers_and_tp_generate_arguments_are_refused_before_any_process_starts(tiny_gqa):
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        shard_model(tiny_gqa, 2, 2)
    import copy

    from miniengine.layers.quant import quantize_model
    with pytest.raises(ValueError, match=r"q_proj is a .*shard the float model, before quantizing"):
        shard_model(quantize_model(copy.deepcopy(tiny_gqa), "int8"), 0, 2)
    with pytest.raises(ValueError, match=r"world_size=3 must divide num_attention_heads=4"):
        tp_generate(tiny_gqa, [[1, 2]], SamplingParams(max_tokens=2), world_size=3)
    with pytest.raises(ValueError, match=r"dtype must be one of \['float32', 'float64'\]"):
        tp_generate(tiny_gqa, [[1, 2]], SamplingParams(max_tokens=2), dtype=torch.float16)


# ------------------------------------------------------------------ two gloo ranks, golden cases

def test_two_ranks_decode_golden_cases_token_exact_in_float32(target, golden):
    """Ten cases (two prompts, all five sampler kinds) through the engine on 2 gloo ranks, against the golden
    tokens; the logits against the same engine on one rank: last-bit differences, far below the screening gap."""
    cases = [c for c in golden["cases"] if c["name"].startswith(("p0-", "p1-"))]
    assert {c["name"].split("-")[1] for c in cases} == {"greedy", "temperature", "top_k", "top_p", "combined"}
    prompts, params = [c["prompt_token_ids"] for c in cases], [params_of(c) for c in cases]
    outs = tp_generate("target", prompts, params, world_size=2, return_logits=True, timeout_s=60)
    for c, o in zip(cases, outs):
        assert o.token_ids == c["token_ids"], c["name"]
        assert o.finish_reason == c["finish_reason"], c["name"]
    engine = LLMEngine(EngineConfig(model=target, max_num_seqs=len(cases)), keep_logits=True)
    seqs = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    while engine.has_unfinished_requests():
        engine.step()
    diff = max((a - b).abs().max().item() for o, s in zip(outs, seqs) for a, b in zip(o.logits, s.logits))
    assert diff < 1e-4  # the sum order changed: last bits only, within the course's float32 tolerance
    assert diff < min(c["min_margins"]["gap"] for c in cases) / 10


def test_a_gqa_model_shards_its_kv_heads_and_stays_exact_in_float64():
    """target-gqa2 (8 query heads, 2 KV heads): one KV head per rank; the reference's own loop on the shards, in
    float64, gives the golden tokens and the unsharded reference's logits to rounding."""
    golden = json.loads((GOLDEN / "gqa2.json").read_text())
    cases = golden["cases"][:6]
    model = load_model(MODELS / "target-gqa2")
    prompts, params = [c["prompt_token_ids"] for c in cases], [params_of(c) for c in cases]
    outs = tp_reference_generate(model, prompts, params, world_size=2, dtype=torch.float64, return_logits=True,
                                 timeout_s=60)
    assert [o.token_ids for o in outs] == [c["token_ids"] for c in cases]
    ref = naive_generate(model, prompts, params, return_logits=True)
    diff = max((a - b).abs().max().item() for o, r in zip(outs, ref) for a, b in zip(o.logits, r.logits))
    assert outs[0].logits[0].dtype == torch.float64 and diff < 1e-10


# ------------------------------------------------------------------ the cost model

def test_ring_allreduce_time_on_a_hand_computed_case():
    link = Interconnect("test link", 100e9, 5e-6)
    # 4 GPUs, 1 MB: 2 * 3/4 * 1e6 / 100e9 = 15 us on the wire, plus 5 us latency.
    assert ring_allreduce_s(1e6, 4, link) == pytest.approx(20e-6, rel=1e-12)
    assert ring_allreduce_s(1e6, 1, link) == 0.0
    with pytest.raises(ValueError, match=r"world_size must be an integer >= 1, got 0"):
        ring_allreduce_s(1e6, 0, link)


def test_tensor_parallel_decode_for_llama3_70b_on_8_gpus_by_hand():
    link = Interconnect("NVLink, per direction", 450e9, 10e-6)
    ideal = CostModel(llama3_70b(), GPUS["H100"], compute_eff=1.0, bandwidth_eff=1.0, overhead_s=0.0)
    step = tensor_parallel_decode(ideal, 8, 1, 1024, link)
    # One all-reduce after attention and one after the MLP in each of 80 layers, of 1 token x 8192 bf16 values:
    # 16,384 bytes; 2 * 7/8 * 16,384 / 450e9 = 63.7 ns on the wire + 10 us latency, 160 times = 1.610 ms.
    assert (step.allreduces, step.allreduce_bytes) == (160, 16384)
    assert step.comm_s == pytest.approx(160 * (2 * 7 / 8 * 16384 / 450e9 + 10e-6), rel=1e-12)
    assert step.comm_s == pytest.approx(1.6102e-3, rel=1e-4)
    # With no overhead, each GPU moves an eighth of the bytes: an eighth of the one-GPU step.
    assert step.compute_s == pytest.approx(ideal.decode(1, 1024).step_time_s / 8, rel=1e-12)
    assert step.comm_share == pytest.approx(step.comm_s / (step.compute_s + step.comm_s))
    paper = CostModel(llama3_70b(), GPUS["H100"])
    one = tensor_parallel_decode(paper, 1, 64, 1024, link)
    assert one.comm_s == 0 and one.compute_s == pytest.approx(paper.decode(64, 1024).step_time_s)


@pytest.mark.slow  # a whole benchmark or regeneration: make test runs it, make quick does not
def test_bench_tp_prints_its_tables_and_summary_line():
    """The benchmark itself, as short as it goes (its timings are measurements, not assertions)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "miniengine", "bench", "tp", "--batches", "1", "--steps", "2",
                        "--repeats", "1", "--cases", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "2 ranks: float32 engine 2/2 token-exact, float64 reference decoder 2/2" in r.stdout
    assert "max |logit difference|" in r.stdout and "Llama-3-70B decode" in r.stdout
    assert "one all-reduce of [1, hidden] float32 on 2 ranks: gloo's all_reduce" in r.stdout
    assert "the course's ring_all_reduce over isend/recv (Lab 09)" in r.stdout
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("tensor parallel: 2 ranks on this CPU ") and "Llama-3-70B on 8 GPUs (NVLink): comm" in last


# ------------------------------------------------------------------ the plug points: split functions and the ring

@pytest.mark.parametrize("world_size,numel", [(1, 7), (2, 10), (2, 9), (3, 10), (4, 4), (5, 3), (4, 1031)])
def test_the_ring_all_reduce_sums_with_identical_bits_on_every_rank_and_sends_2_p_minus_1_over_p(world_size, numel):
    """Uneven chunks and fewer elements than ranks included; float64 sums against math.fsum-exact values."""
    import math

    gen = torch.Generator().manual_seed(numel)
    xs = [torch.randn(numel, generator=gen, dtype=torch.float64).reshape(-1, 1) for _ in range(world_size)]
    ring = ThreadRing(world_size)
    outs = ring.run(lambda comm, x: ring_all_reduce(x, comm), xs)
    exact = torch.tensor([math.fsum(float(x[i]) for x in xs) for i in range(numel)], dtype=torch.float64)
    for r, out in enumerate(outs):
        assert out.shape == xs[r].shape and torch.equal(out, outs[0]), f"rank {r} differs from rank 0"
        torch.testing.assert_close(out.reshape(-1), exact, rtol=0, atol=1e-12)
    # Each chunk travels p-1 hops while being summed and p-1 while being copied back.
    assert sum(c.bytes_sent for c in ring.comms) == 2 * (world_size - 1) * numel * 8
    biggest = -(-numel // world_size)
    assert max(c.bytes_sent for c in ring.comms) <= 2 * (world_size - 1) * biggest * 8
    if world_size == 2:  # two addends: a + b == b + a in IEEE arithmetic, the same bits as gloo's sum
        assert torch.equal(outs[0], xs[0] + xs[1])


def test_thread_ring_names_the_rank_left_waiting_and_a_mismatched_receive():
    def unequal(comm, x):  # rank 0 exchanges twice, rank 1 once
        for _ in range(2 if comm.rank == 0 else 1):
            comm.ring_exchange(x, torch.empty_like(x))
        return x

    with pytest.raises(TimeoutError, match=r"rank 0 waited 1 s in its exchange 2 for rank 1: every rank must call "
                                           r"ring_exchange the same number of times"):
        ThreadRing(2, timeout_s=1).run(unequal, [torch.ones(3), torch.ones(3)])
    with pytest.raises(ValueError, match=r"rank 1 sent 3 torch.float32 values, but recv holds 2 torch.float32"):
        ThreadRing(2).run(lambda comm, x: comm.ring_exchange(x, torch.empty(2)), [torch.ones(3), torch.ones(3)])
    with pytest.raises(ValueError, match=r"inputs must hold one entry per rank \(3\), got 2"):
        ThreadRing(3).run(lambda comm, x: x, [1, 2])


def test_a_split_plug_of_the_wrong_shape_is_named_with_its_layer(tiny_gqa):
    with pytest.raises(ValueError, match=r"column_shard\(weight of shape \[32, 32\], rank=0, world_size=2\) for layer 0 "
                                         r"q_proj returned shape \[32, 16\], expected \[16, 32\]"):
        shard_model(tiny_gqa, 0, 2, plan=Plan(column_shard=lambda w, r, p: row_shard(w, r, p)))
    with pytest.raises(TypeError, match=r"row_shard returned list for layer 0 o_proj, expected a torch.Tensor"):
        shard_model(tiny_gqa, 0, 2, plan=Plan(row_shard=lambda w, r, p: [w]))
    with pytest.raises(TypeError, match=r"all_reduce must be a function, got int"):
        Plan(all_reduce=3)


def test_plugged_in_notebook_style_functions_run_on_two_gloo_ranks_token_exact(golden):
    """Split functions and a ring all-reduce defined locally (pickled by value, as a notebook's are), over
    torch.distributed point-to-point messages: the golden tokens."""
    def my_column(w, rank, p):
        return w.chunk(p, 0)[rank]

    def my_row(w, rank, p):
        return w.chunk(p, 1)[rank]

    def my_all_reduce(x, comm):  # not a ring's traffic: every tensor goes all the way round, summed in rank order
        held, passing = {comm.rank: x.clone()}, x.clone()
        for step in range(1, comm.world_size):
            passing = comm.ring_exchange(passing, torch.empty_like(passing))
            held[(comm.rank - step) % comm.world_size] = passing.clone()
        total = held[0].clone()
        for r in range(1, comm.world_size):
            total += held[r]
        return total

    cases = [c for c in golden["cases"] if c["name"].startswith("p2-")]
    outs = tp_generate("target", [c["prompt_token_ids"] for c in cases], [params_of(c) for c in cases], world_size=2,
                       plan=Plan(my_column, my_row, my_all_reduce), timeout_s=60)
    assert [o.token_ids for o in outs] == [c["token_ids"] for c in cases]


def test_llm_serves_generate_on_two_ranks_and_refuses_what_it_cannot_do(target):
    llm = LLM(tensor_parallel_size=2)
    prompts = ["def fibonacci(n):", "import os"]
    params = SamplingParams(temperature=0, max_tokens=8)
    got = llm.generate(prompts, params)
    want = LLM(model=target).generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.text for o in got] == [o.text for o in want] and got[0].prompt == prompts[0]
    with pytest.raises(ValueError, match=r"step drives one engine step by step; with tensor_parallel_size=2 each "
                                         r"generate\(\) call starts and ends the ranks: use generate\(\)"):
        llm.step()
    with pytest.raises(ValueError, match=r"request 1: with tensor_parallel_size > 1 each request has one completion"):
        llm.generate(prompts, [params, SamplingParams(n=2, max_tokens=4)])
    with pytest.raises(ValueError, match=r"tensor_parallel_size must be an integer >= 1, got 0"):
        LLM(tensor_parallel_size=0)
    with pytest.raises(ValueError, match=r"with tensor_parallel_size=2, LLM takes no engine arguments; got max_num_seqs"):
        LLM(tensor_parallel_size=2, max_num_seqs=4)
    with pytest.raises(TypeError, match=r"tensor_parallel_plan must be a miniengine.distributed.Plan, got dict"):
        LLM(tensor_parallel_size=2, tensor_parallel_plan={})
