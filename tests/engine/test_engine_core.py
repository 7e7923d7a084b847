"""The engine core: golden tokens at every batch size and under arrivals, budgets, and each plug point
run with an independent, non-default implementation written here."""
import numpy as np
import pytest
import torch
from scheduler_invariants import kv_tokens_held

from miniengine import LLM, SamplingParams
from miniengine.attention import causal_attention
from miniengine.engine import FCFSPolicy
from miniengine.kv import PagedKV, PerSequenceKV
from miniengine.layers.sampler import PerRowSampler
from miniengine.sampling import gumbel_noise


def params_of(case):
    return SamplingParams(**case["params"])


@pytest.fixture(scope="module")
def all_cases(golden, hidden_golden):
    return golden["cases"] + hidden_golden["cases"]


def check_golden(llm, cases):
    outs = llm.generate([c["prompt_token_ids"] for c in cases], [params_of(c) for c in cases])
    for c, o in zip(cases, outs):
        assert o.token_ids == c["token_ids"], c["name"]
        assert o.finish_reason == c["finish_reason"], c["name"]
        assert o.tokens_processed == len(c["prompt_token_ids"]) + len(c["token_ids"]) - 1, c["name"]


@pytest.mark.parametrize("max_num_seqs", [1, 4, 16, 64])
def test_every_golden_case_is_exact_at_every_batch_size(all_cases, max_num_seqs):
    """80 cases (visible and hidden, greedy and sampled); the batch holds up to max_num_seqs of them."""
    check_golden(LLM(max_num_seqs=max_num_seqs), all_cases)


def test_requests_joining_between_steps_stay_exact(golden):
    """A seeded arrival order: 1-3 new requests join after each step, mixing prefills into running decodes."""
    llm, rng = LLM(max_num_seqs=8, kv_cache_tokens=1024), np.random.default_rng(0)
    cases, pending, done = golden["cases"], list(range(len(golden["cases"]))), {}
    while pending or llm.has_unfinished_requests():
        for _ in range(min(len(pending), int(rng.integers(0, 4)))):
            i = pending.pop(int(rng.integers(len(pending))))
            llm.add_request(cases[i]["prompt_token_ids"], params_of(cases[i]), request_id=i)
        for o in llm.step():
            if o.finished:
                done[o.request_id] = o.token_ids
    assert {i: cases[i]["token_ids"] for i in done} == done and len(done) == len(cases)


class StepRecorder:
    """Wraps the scheduler to check the budgets after every step."""

    def __init__(self, engine):
        self.engine, self.steps = engine, []
        inner = engine.scheduler.schedule

        def schedule(now=0.0):
            batch = inner(now)
            self.steps.append((len(batch.seqs), batch.num_tokens, kv_tokens_held(engine.kv)))
            return batch
        engine.scheduler.schedule = schedule


def test_budgets_hold_at_every_step(golden):
    llm = LLM(max_num_seqs=3, max_num_batched_tokens=40, kv_cache_tokens=200)
    rec = StepRecorder(llm.engine)
    cases = golden["cases"][:12]
    check_golden(llm, cases)
    assert all(n <= 3 and t <= 40 and kv <= 200 for n, t, kv in rec.steps), rec.steps
    assert max(n for n, _, _ in rec.steps) == 3  # the budgets bind, so the test means something
    assert kv_tokens_held(llm.engine.kv) == 0  # every finished request gave its KV back


# ------------------------------------------------------------------ plug points, each with an independent implementation

def torch_sample(logits_row, params, position):
    """A sampler written apart from miniengine.sampling: torch sorting for top-k/top-p, the same keyed noise."""
    x = torch.as_tensor(logits_row, dtype=torch.float64)  # PerRowSampler hands rows over as numpy float64
    if params.temperature == 0:
        return int(torch.argmax(x))
    x = x / params.temperature
    order = torch.argsort(x, descending=True, stable=True)
    keep = torch.ones_like(x, dtype=torch.bool)
    if 0 < params.top_k < x.numel():
        keep[order[params.top_k:]] = False
        keep |= x >= x[order[params.top_k - 1]]  # ties with the k-th value stay
    masked = torch.where(keep, x, torch.tensor(-torch.inf, dtype=x.dtype))
    if params.top_p < 1:
        probs = torch.softmax(masked, 0)[order]
        before = torch.cumsum(probs, 0) - probs
        nucleus = torch.zeros_like(keep)
        nucleus[order[before < params.top_p]] = True
        masked = torch.where(nucleus, masked, torch.tensor(-torch.inf, dtype=x.dtype))
    noise = torch.from_numpy(gumbel_noise(params.seed, position, x.numel()))
    return int(torch.argmax(masked + noise))


def test_sampler_plug_point(all_cases):
    check_golden(LLM(sampler=PerRowSampler(torch_sample)), all_cases)


class LoopCache:
    """One sequence's K/V as Python lists of per-token tensors: as unlike the course's arena as can be."""

    def __init__(self, config, max_len, dtype, device):
        self.k = [[] for _ in range(config.num_hidden_layers)]
        self.v = [[] for _ in range(config.num_hidden_layers)]
        self.length = 0


class LoopBackend:
    def __init__(self, caches, new_tokens):
        self.caches, self.new_tokens = caches, new_tokens

    def positions(self, device="cpu"):
        return torch.tensor([c.length + i for c, n in zip(self.caches, self.new_tokens) for i in range(n)], device=device)

    def attend(self, layer, q, k, v):
        outs, start = [], 0
        for c, n in zip(self.caches, self.new_tokens):
            c.k[layer] += list(k[start:start + n])
            c.v[layer] += list(v[start:start + n])
            total = c.length + n
            pos = torch.arange(total)
            outs.append(causal_attention(q[start:start + n], torch.stack(c.k[layer]), torch.stack(c.v[layer]), pos[c.length:], pos))
            start += n
        return torch.cat(outs)

    def advance(self):
        for c, n in zip(self.caches, self.new_tokens):
            c.length += n


def test_kv_plug_point(all_cases):
    llm = LLM(kv=PerSequenceKV(LoopCache, LoopBackend, LLM().model.config, torch.float32, "cpu"))
    check_golden(llm, all_cases[::2])


class DictBlockManager:
    """A block manager written apart from miniengine.kv.block_manager: a set of free blocks handed out
    highest first, counts in a dict, tables on a dict by seq_id."""

    def __init__(self, num_blocks, block_size):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.unused, self.count, self.block_tables = set(range(num_blocks)), {}, {}

    def _new(self):
        b = max(self.unused)
        self.unused.remove(b)
        self.count[b] = 1
        return b

    def can_allocate(self, seq):
        return -(-seq.num_tokens // self.block_size) <= len(self.unused)

    def allocate(self, seq):
        self.block_tables[seq.seq_id] = [self._new() for _ in range(-(-seq.num_tokens // self.block_size))]

    def can_append(self, seq):
        t = self.block_tables[seq.seq_id]
        grow = seq.num_tokens > len(t) * self.block_size
        shared = not grow and self.count[t[(seq.num_tokens - 1) // self.block_size]] > 1
        return not (grow or shared) or bool(self.unused)

    def append_slot(self, seq):
        t = self.block_tables[seq.seq_id]
        if seq.num_tokens > len(t) * self.block_size:
            t.append(self._new())
            return None
        i = (seq.num_tokens - 1) // self.block_size
        if self.count[t[i]] == 1:
            return None
        old, t[i] = t[i], self._new()
        self.count[old] -= 1
        return old, t[i]

    def fork(self, parent, child):
        self.block_tables[child.seq_id] = list(self.block_tables[parent.seq_id])
        for b in self.block_tables[child.seq_id]:
            self.count[b] += 1

    def free(self, seq):
        for b in self.block_tables.pop(seq.seq_id):
            self.count[b] -= 1
            if self.count[b] == 0:
                self.unused.add(b)


def loop_gather(cache, block_tables, num_keys):
    """Sequence by sequence, position by position."""
    bs = cache.shape[1]
    return torch.stack([torch.stack([cache[int(t[j // bs]), j % bs] for j in range(num_keys)]) for t in block_tables])


def test_block_manager_and_gather_plug_points(all_cases, golden, hidden_golden):
    """Both paged plug points replaced, under memory pressure (preemptions), with n > 1 forks."""
    cfg = LLM().model.config
    need = sum(len(c["prompt_token_ids"]) + c["params"]["max_tokens"] for c in all_cases[::3])
    blocks = need // 4 // 8
    llm = LLM(kv=PagedKV(cfg, blocks, 8, block_manager=DictBlockManager(blocks, 8), gather=loop_gather))
    cases = all_cases[::3]
    outs = llm.generate([c["prompt_token_ids"] for c in cases], [params_of(c) for c in cases])
    assert [o.token_ids for o in outs] == [c["token_ids"] for c in cases]  # (recompute adds to tokens_processed)
    assert llm.engine.scheduler.num_preemptions > 0
    forks = golden["fork_cases"] + hidden_golden["fork_cases"]
    outs = llm.generate([c["prompt_token_ids"] for c in forks], [params_of(c) for c in forks])
    for out, c in zip(outs, forks):
        assert [o.token_ids for o in out.outputs] == [w["token_ids"] for w in c["completions"]], c["name"]


class OnePrefillPerStep:
    """A different policy: at most one new request per step, oldest first."""

    def admit(self, waiting, running, budget):
        head = waiting[:1]
        return list(head) if head and budget.max_seqs and head[0].num_new_tokens <= budget.max_tokens else []


def test_scheduling_policy_plug_point(golden):
    llm = LLM(scheduling_policy=OnePrefillPerStep())
    rec = StepRecorder(llm.engine)
    check_golden(llm, golden["cases"])
    assert len(rec.steps) > max(len(c["token_ids"]) for c in golden["cases"])  # admitting one by one took longer


def test_a_policy_that_breaks_the_budget_gets_a_clear_error(golden):
    class Greedy:
        def admit(self, waiting, running, budget):
            return list(waiting)

    llm = LLM(scheduling_policy=Greedy(), max_num_seqs=2)
    for c in golden["cases"][:3]:
        llm.add_request(c["prompt_token_ids"], params_of(c))
    with pytest.raises(RuntimeError, match=r"Greedy.admit returned 3 sequences, but only 2 may join this step \(max_num_seqs=2\)"):
        llm.step()

    class Lazy:
        def admit(self, waiting, running, budget):
            return []

    llm = LLM(scheduling_policy=Lazy())
    llm.add_request([1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="admitted no request while none is running, with 1 waiting"):
        llm.step()


def test_fcfs_never_lets_a_later_request_overtake(golden):
    """With KV memory for one long request at a time, a short request that arrived later waits its turn."""
    llm = LLM(kv_cache_tokens=60, scheduling_policy=FCFSPolicy(), kv_layout="contiguous")  # reserve up front
    long_, short = [1] * 30, [2] * 3
    a = llm.add_request(long_, SamplingParams(max_tokens=25, ignore_eos=True, temperature=0))
    b = llm.add_request(long_, SamplingParams(max_tokens=25, ignore_eos=True, temperature=0))
    c = llm.add_request(short, SamplingParams(max_tokens=2, ignore_eos=True, temperature=0))
    first_token = []  # request ids in the order they got their first token, i.e. were admitted
    while llm.has_unfinished_requests():
        first_token += [o.request_id for o in llm.step() if len(o.token_ids) == 1]
    assert first_token == [a, b, c]  # c fitted beside a all along, but b came first


def test_the_reference_shares_nothing_with_the_engine():
    import ast
    import pathlib
    src = pathlib.Path(__file__).parents[2] / "miniengine" / "reference.py"
    imported = {n.module for n in ast.walk(ast.parse(src.read_text())) if isinstance(n, ast.ImportFrom)}
    assert not imported & {"engine", "kv", "layers", "llm", "config", "kv_cache"}, imported
