"""Lab 09's tests: what each test cell checks, written once for its visible and its hidden cell.

Every check runs with the answer key forbidden (``miniengine.distributed``'s ``column_shard``, ``row_shard`` and
``ring_all_reduce``: a call to any of them, under any name, fails the test), on your functions passed in by the cell.
Every check also observes what your code gave (the slices' shapes and which rows or columns they hold, distances,
the ranks' results and the values they sent, tokens): the grader compares them with the answer sheet outside your
kernel, a hidden case's with the solution's (autograder/grade/sheets.py), and no hidden message states an expected value.

Task 1, ``column_shard`` and ``row_shard`` (``check_shards``): on random weights, every rank's slice must be the
block the task names, rows r*out/p .. (r+1)*out/p - 1 for column_shard and the same columns for row_shard, of that
shape, with the full weight left unchanged. Then one decoder layer of the real model (float64) is sharded with your
functions by the engine's own ``shard_model``: the ranks' partial outputs of the attention block and of the MLP
(what the all-reduce would add up) must add up to the full layer's outputs, within 1e-10.

Task 2, ``ring_all_reduce`` (``check_rings``): with one rank it must return the tensor. On p threads joined by
``ThreadRing``, every rank must return a tensor of the input's shape and dtype holding the sum over the ranks
(compared with an exactly rounded sum), the same bits on every rank (exactly a + b with two ranks), and the traffic
of a ring: 2(p-1)N values sent in all, at most 2(p-1) chunks of about N/p values by any one rank.

Your parts in the engine (``check_engine``, ``report_engine``): LLM(tensor_parallel_size=2) with your three functions
serves the golden requests on two processes, and every token must be the golden one. The hidden test sends its
tokens to the grader, which compares them outside your kernel.
"""
from __future__ import annotations

import builtins
import math
import re

import torch

import autograder.notebook_checks as checks
import miniengine.distributed as tp
from miniengine import LLM, SamplingParams
from miniengine.attention import NoCacheBackend

# This lab's answer key: any call into it while a test runs fails the test (checks.reference_forbidden).
ANSWER_KEY = {"miniengine.distributed": ["column_shard", "row_shard", "ring_all_reduce"]}


def as_tensor(x, what):
    if not isinstance(x, torch.Tensor):
        raise AssertionError(f"{what}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def expected(value, hidden):
    """observe's keywords: a visible case's expected value; none for a hidden one (the sheet holds the solution's)."""
    return {} if hidden else {"expect": value}


def said(text, hidden):
    """A message's statement of the expected value, left out of a hidden case's message."""
    return "" if hidden else text


def slices_of(part, weight, dim):
    """Which rows (dim 0) or columns (dim 1) of weight each row or column of part is, in order (-1: none of them):
    what a split returned, as plain ints for the grader."""
    if part.dim() != 2 or part.shape[1 - dim] != weight.shape[1 - dim] or part.dtype != weight.dtype:
        return None
    whole, mine = weight.movedim(dim, 0), part.movedim(dim, 0)
    return [next((j for j in range(whole.shape[0]) if torch.equal(x, whole[j])), -1) for x in mine]


def check_split(column_shard, row_shard, seed, out_features, in_features, world_size, label, hidden=False):
    """Every rank's slices: the block the task names, of the right shape; the weight itself left as it was.
    Observes, for each rank, the shape of each slice and which rows (columns) of the weight it holds."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=gen, dtype=torch.float64)
    before = weight.clone()
    rows, cols = out_features // world_size, in_features // world_size
    for rank in range(world_size):
        where = f"{label}, rank {rank} of {world_size}, weight [{out_features}, {in_features}]"
        c = as_tensor(column_shard(weight, rank, world_size), where + ": column_shard")
        checks.observe(f"{where}: column_shard's shape", list(c.shape), **expected([rows, in_features], hidden))
        assert list(c.shape) == [rows, in_features], (
            f"{where}: column_shard returned shape {list(c.shape)}"
            + said(f", expected [{rows}, {in_features}]", hidden) + " (a block of rows)")
        checks.observe(f"{where}: the weight's rows column_shard returned", slices_of(c, before, 0),
                       **expected(list(range(rank * rows, (rank + 1) * rows)), hidden))
        assert torch.equal(c, before[rank * rows:(rank + 1) * rows]), (
            f"{where}: column_shard must return " + said(f"rows {rank * rows} to {(rank + 1) * rows - 1}, ", hidden)
            + f"rank {rank}'s contiguous block of rows (whole heads stay together)")
        r = as_tensor(row_shard(weight, rank, world_size), where + ": row_shard")
        checks.observe(f"{where}: row_shard's shape", list(r.shape), **expected([out_features, cols], hidden))
        assert list(r.shape) == [out_features, cols], (
            f"{where}: row_shard returned shape {list(r.shape)}"
            + said(f", expected [{out_features}, {cols}]", hidden) + " (a block of columns)")
        checks.observe(f"{where}: the weight's columns row_shard returned", slices_of(r, before, 1),
                       **expected(list(range(rank * cols, (rank + 1) * cols)), hidden))
        assert torch.equal(r, before[:, rank * cols:(rank + 1) * cols]), (
            f"{where}: row_shard must return " + said(f"columns {rank * cols} to {(rank + 1) * cols - 1}, ", hidden)
            + f"rank {rank}'s contiguous block of columns")
        assert torch.equal(weight, before), f"{where}: the split changed the full weight; slice it, do not write into it"
        checks.observe(f"{where}: the full weight is unchanged", True, expect=True)


@torch.no_grad()
def check_layer(column_shard, row_shard, model64, world_size, layer_index, label):
    """Megatron's identity on one decoder layer of the real model, sharded by your functions with the engine's own
    shard_model: the ranks' partial outputs of each block (the all-reduce's inputs) add up to the full block's output.
    Observes both distances, each bounded by 1e-10."""
    plan = tp.Plan(column_shard=column_shard, row_shard=row_shard)
    shards = [tp.shard_model(model64, r, world_size, plan=plan) for r in range(world_size)]
    for s in shards:
        for m in s.modules():
            if isinstance(m, tp.RowParallelLinear):
                m.world_size = 1  # no collective here: the test adds the partial sums itself
    gen = torch.Generator().manual_seed(900 + layer_index)
    x = torch.randn(7, model64.config.hidden_size, generator=gen, dtype=torch.float64)
    cos, sin = model64.rope_tables(x.dtype, x.device)
    cos, sin = cos[torch.arange(7)], sin[torch.arange(7)]
    full = model64.model.layers[layer_index]
    parts = [s.model.layers[layer_index] for s in shards]
    attn = sum(p.self_attn(x, cos, sin, NoCacheBackend([7])) for p in parts)
    want = full.self_attn(x, cos, sin, NoCacheBackend([7]))
    err = (attn - want).abs().max().item()
    checks.observe(f"{label}: the ranks' attention outputs summed, largest distance from the full layer's", err,
                   at_most=1e-10)
    assert err < 1e-10, (f"{label}: the {world_size} ranks' attention outputs of layer {layer_index} add up to something "
                         f"{err:.3g} away from the full layer's: each rank must keep whole heads of q/k/v (rows) and the "
                         f"matching columns of o_proj")
    mlp = sum(p.mlp(x) for p in parts)
    err = (mlp - full.mlp(x)).abs().max().item()
    checks.observe(f"{label}: the ranks' MLP outputs summed, largest distance from the full MLP's", err, at_most=1e-10)
    assert err < 1e-10, (f"{label}: the ranks' MLP outputs of layer {layer_index} add up to something {err:.3g} away "
                         f"from the full MLP's: gate/up rows and down_proj columns must be the same slice")


def check_shards(column_shard, row_shard, splits, layers, label, hidden=False):
    """Task 1: check_split on every (seed, out, in, ranks) of splits, labelled "<label> <seed>"; then check_layer on
    every (ranks, layer index, label) of layers, on the real model in float64. A negative layer index counts from the
    last layer, and "{p}" and "{layer}" in a layer's label become its ranks and its layer's number. hidden: the
    slices are observed without the expected ones, and the messages do not state them."""
    checks.require_own(column_shard, "column_shard")
    checks.require_own(row_shard, "row_shard")
    model64 = checks.load_model(torch.float64)
    with checks.reference_forbidden("column_shard and row_shard", forbidden=ANSWER_KEY):
        for seed, out_f, in_f, p in splits:
            check_split(column_shard, row_shard, seed, out_f, in_f, p, f"{label} {seed}", hidden)
        for p, layer, what in layers:
            layer %= model64.config.num_hidden_layers  # -1: the last layer, by its number (it seeds the input)
            check_layer(column_shard, row_shard, model64, p, layer, what.format(p=p, layer=layer))


def check_ring(ring_all_reduce, seed, world_size, shape, dtype, label, hidden=False):
    """Your ring_all_reduce on world_size threads (tp.ThreadRing): the sum, identical bits on every
    rank, and a ring's traffic: every rank sends 2(p-1) chunks, 2(p-1)/p of the tensor. Observes each rank's
    shape and dtype and distance from the exact sum, how many ranks hold rank 0's bits, and the values sent."""
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype) for _ in range(world_size)]
    inputs = [x.clone() for x in xs]  # your function may reduce in place
    ring = tp.ThreadRing(world_size, timeout_s=10)
    outs = ring.run(lambda comm, x: ring_all_reduce(x, comm), inputs)
    numel, size = xs[0].numel(), xs[0].element_size()
    exact = torch.tensor([math.fsum(float(x.reshape(-1)[i]) for x in xs) for i in range(numel)], dtype=torch.float64)
    tol = 1e-12 if dtype == torch.float64 else 1e-5 * world_size
    for r, out in enumerate(outs):
        where = f"{label}, rank {r}"
        out = as_tensor(out, where + ": ring_all_reduce's return value")
        checks.observe(f"{where}: shape and dtype", [list(out.shape), str(out.dtype)],
                       **expected([list(xs[r].shape), str(dtype)], hidden))
        assert out.shape == xs[r].shape and out.dtype == dtype, (
            f"{where}: returned shape {list(out.shape)} {out.dtype}, "
            + ("not the input's" if hidden else f"expected the input's {list(xs[r].shape)} {dtype}"))
        err = (out.double().reshape(-1) - exact).abs().max().item() if numel else 0.0
        checks.observe(f"{where}: largest distance from the exact sum over the ranks", err, at_most=tol)
        assert err <= tol, f"{where}: the result is {err:.3g} away from the sum over the ranks"
        assert torch.equal(out, outs[0]), (
            f"{where}: its result differs from rank 0's in the last bits. Every rank must end with the same bits "
            f"(else they may pick different tokens): sum each chunk once, then copy it around (the all-gather)")
    checks.observe(f"{label}: ranks whose result has rank 0's bits", sum(torch.equal(o, outs[0]) for o in outs),
                   **expected(world_size, hidden))
    if world_size == 2 and numel:
        assert torch.equal(outs[0], xs[0] + xs[1]), f"{label}: with two ranks each element is exactly a + b"
        checks.observe(f"{label}: with two ranks, each element is exactly a + b", True, expect=True)
    sent = [c.bytes_sent for c in ring.comms]
    want_total = 2 * (world_size - 1) * numel * size
    checks.observe(f"{label}: values sent by all ranks", sum(sent) // size, **expected(want_total // size, hidden))
    assert sum(sent) == want_total, (
        f"{label}: the ranks sent {sum(sent) // size} values in all; a ring all-reduce sends each of the p chunks p-1 "
        f"times to sum it and p-1 times to spread it: 2(p-1)N" + said(f" = {want_total // size}", hidden)
        + f" values for N = {numel}")
    most = 2 * (world_size - 1) * -(-numel // world_size) * size
    checks.observe(f"{label}: values sent by the busiest rank", max(sent) // size, at_most=most // size)
    assert max(sent) <= most, (
        f"{label}: rank {sent.index(max(sent))} sent {max(sent) // size} values; in a ring each rank sends 2(p-1) "
        f"chunks of about N/p values" + said(f", at most {most // size} here", hidden))
    return sent


def check_one_rank(ring_all_reduce):
    """With one rank there is nobody to talk to: the sum is the tensor itself."""
    out = tp.ThreadRing(1).run(lambda comm, x: ring_all_reduce(x, comm), [torch.arange(6.0).reshape(2, 3)])[0]
    out = as_tensor(out, "one rank")
    assert torch.equal(out, torch.arange(6.0).reshape(2, 3)), "with one rank the sum is the tensor"
    checks.observe("one rank: ring_all_reduce's result", out.tolist(), expect=torch.arange(6.0).reshape(2, 3).tolist())


def check_rings(ring_all_reduce, cases, label, one_rank=False, hidden=False):
    """Task 2: check_ring on every (seed, ranks, shape, dtype) case, labelled "<label> <seed>: ..."; first, with
    one_rank, the one-rank case. hidden: observed without the expected values, which no message states."""
    checks.require_own(ring_all_reduce, "ring_all_reduce")
    with checks.reference_forbidden("ring_all_reduce", forbidden=ANSWER_KEY):
        if one_rank:
            check_one_rank(ring_all_reduce)
        for seed, p, shape, dtype in cases:
            check_ring(ring_all_reduce, seed, p, shape, dtype, f"{label} {seed}: {p} ranks, shape {list(shape)}, {dtype}",
                       hidden)


def own_functions(column_shard, row_shard, ring_all_reduce):
    checks.require_own(column_shard, "column_shard")
    checks.require_own(row_shard, "row_shard")
    checks.require_own(ring_all_reduce, "ring_all_reduce")


class RankError(RuntimeError):
    """A rank process raised: what it raised, and where in your code (torch only says which process ended)."""


RANK_FAILED = re.compile(r"-- Process (\d+) terminated with the following error:\n(.*)", re.S)
FRAME = re.compile(r'^  File "([^"]+)", line (\d+), in (\S+)$', re.M)


def rank_failure(error: BaseException, what: str, hidden: bool) -> RankError | None:
    """torch.multiprocessing's ProcessRaisedException holds the rank's traceback as text, and its first line says
    only "-- Process 0 terminated with the following error:".  The rank's exception (its last lines) and the last
    frame of a notebook cell in it (your function, and the line) make the message.  A hidden test's message names
    the exception's type alone, when it is Python's own: its text could hold what your code saw of a hidden input."""
    found = RANK_FAILED.search(str(error))
    if found is None:
        return None
    rank, trace = found.group(1), found.group(2).rstrip()
    frames = list(FRAME.finditer(trace))
    tail = trace[frames[-1].end():].splitlines() if frames else trace.splitlines()
    raised = "\n".join(ln for ln in tail if ln and not ln.startswith(" ")).strip() or "an exception"
    ename = raised.split(":", 1)[0].strip()
    cells = [f for f in frames if "ipykernel_" in f.group(1)]  # each notebook cell is compiled to a file of its own
    where = f"in {cells[-1].group(3)}, at line {cells[-1].group(2)} of its cell" if cells else (
        f"in {frames[-1].group(3)} ({frames[-1].group(1).rsplit('/', 1)[-1]}:{frames[-1].group(2)})" if frames else "")
    if hidden:
        shown = ename if isinstance(getattr(builtins, ename, None), type) else "an exception"
        return RankError(f"your engine on 2 ranks, {what}: rank {rank} raised {shown} {where}".rstrip())
    return RankError(f"{what} on 2 ranks: rank {rank} raised {raised}" + (f"\n  {where}" if where else ""))


def engine_tokens(column_shard, row_shard, ring_all_reduce, cases, what, hidden=False):
    """The engine on 2 processes with your three functions (sent to the ranks by value): every case's tokens, as
    plain ints.  A rank that raises fails the test with its exception and where it was raised (rank_failure)."""
    from torch.multiprocessing import ProcessRaisedException

    with checks.reference_forbidden("your tensor-parallel parts", forbidden=ANSWER_KEY):
        plan = tp.Plan(column_shard=column_shard, row_shard=row_shard, all_reduce=ring_all_reduce)
        llm = LLM(model=str(checks.TARGET), tensor_parallel_size=2, tensor_parallel_plan=plan)
        try:
            outs = llm.generate([c["prompt_token_ids"] for c in cases], [SamplingParams(**c["params"]) for c in cases])
        except ProcessRaisedException as e:
            failure = rank_failure(e, what, hidden)
            if failure is None:
                raise
            raise failure from None
        head = f"your engine on 2 ranks, {what}" if hidden else f"{what} on 2 ranks"  # a hidden message's prefix
        return [checks.as_tokens(o.token_ids, f"{head}, request {i}: token_ids") for i, o in enumerate(outs)]


def check_engine(column_shard, row_shard, ring_all_reduce, cases, label):
    """The visible test: every case's tokens on 2 ranks must be its golden tokens. Returns the number of cases."""
    own_functions(column_shard, row_shard, ring_all_reduce)
    got = engine_tokens(column_shard, row_shard, ring_all_reduce, cases, f"{label} cases")
    for c, toks in zip(cases, got):
        want = c["token_ids"]
        first = next((i for i, (a, b) in enumerate(zip(toks, want)) if a != b), min(len(toks), len(want)))
        assert toks == want, (f"{label} case {c['name']} on 2 ranks: tokens differ from golden at step {first} "
                              f"(got {toks[first:first + 3]}..., expected {want[first:first + 3]}...)")
        checks.observe(f"{label} case {c['name']} on 2 ranks: tokens", toks, expect=want)
    return len(cases)


def report_engine(column_shard, row_shard, ring_all_reduce, report, label):
    """The hidden test: the hidden golden prompts on 2 ranks; their tokens go to the grader, which compares them
    outside this kernel."""
    own_functions(column_shard, row_shard, ring_all_reduce)
    cases = report.cases("golden")
    got = engine_tokens(column_shard, row_shard, ring_all_reduce, cases, f"{label} cases", hidden=True)
    for c, toks in zip(cases, got):
        report.add("golden", c, "token_ids", toks)
    return len(cases)
