"""The plug points (miniengine/plugs/): every Protocol is listed with its lab and default, every default fits it,
and a plugged object that misses a method gets a message naming the field, the class, the method and the lab."""
import importlib
import inspect
import re

import pytest
import torch

from miniengine import plugs
from miniengine.config import EngineConfig
from miniengine.engine import Sequence
from miniengine.kv import PagedKV, PerSequenceKV
from miniengine.layers.sampler import PerRowSampler
from miniengine.model import load_config
from miniengine.paths import MODELS, TARGET
from miniengine.plugs.conformance import PlugError, check
from miniengine.sampling import SamplingParams

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)

PROTOCOLS = [v for v in vars(plugs).values()
             if inspect.isclass(v) and v.__module__ == plugs.__name__ and getattr(v, "_is_protocol", False)]


@pytest.fixture(scope="module")
def cfg():
    return load_config(TARGET)


def resolve(path):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def test_every_protocol_is_listed_with_its_lab_and_default():
    assert len(PROTOCOLS) >= 10
    assert set(PROTOCOLS) == set(plugs.PLUG_POINTS), "a Protocol in plugs.py is missing from PLUG_POINTS (or vice versa)"
    for proto, point in plugs.PLUG_POINTS.items():
        assert getattr(proto, "_is_runtime_protocol", False), f"{proto.__name__} is not @runtime_checkable"
        assert point.labs and all(isinstance(n, int) and 1 <= n <= 10 for n in point.labs), proto.__name__
        assert re.fullmatch(r"Labs? \d\d(, \d\d)*", point.lab)
        assert callable(resolve(point.default)) and point.taken, proto.__name__
        assert proto.__doc__ and len(proto.__doc__) > 80, f"{proto.__name__} needs a docstring stating its contract"


def default_instance(proto, cfg):
    """The course's implementation of each plug point, as the engine holds it (an instance, or the function)."""
    from miniengine.cost.roofline import GPUS, CostModel, llama3_8b
    from miniengine.model import load_model
    from miniengine.spec.proposer import DraftProposer

    default = resolve(plugs.PLUG_POINTS[proto].default)
    if not inspect.isclass(default) or proto in (plugs.CacheFactory, plugs.BackendFactory):
        return default  # a function, or a class plugged in as a constructor
    if default is PagedKV:
        return PagedKV(cfg, 4, 4)
    if proto is plugs.AttentionBackend:
        kv = PagedKV(cfg, 4, 4)
        seq = Sequence([1, 2, 3], SamplingParams())
        kv.allocate(seq)
        return kv.backend([seq], [3])
    if default is CostModel:
        return CostModel(llama3_8b(), GPUS["H100"])
    if default is DraftProposer:
        return DraftProposer(load_model(MODELS / "draft"), 4, 4, "coupled")
    try:
        return default(4, 4)  # the block managers
    except TypeError:
        return default()


@pytest.mark.parametrize("proto", PROTOCOLS, ids=lambda p: p.__name__)
def test_every_default_satisfies_its_protocol(proto, cfg):
    obj = default_instance(proto, cfg)
    assert isinstance(obj, proto)
    assert check("x", obj, proto) is obj
    default = resolve(plugs.PLUG_POINTS[proto].default)
    assert obj is default or isinstance(obj, default)


def test_the_other_course_parts_satisfy_their_protocols(cfg):
    from miniengine.distributed import row_shard
    from miniengine.kv import ContiguousKV
    from miniengine.layers.quant import Int4GroupWise
    from miniengine.spec.verify import rejection_verify
    for obj, proto in ((ContiguousKV(cfg, 64), plugs.KVLayout), (ContiguousKV(cfg, 64), plugs.SpeculativeKV),
                       (Int4GroupWise(64), plugs.QuantScheme), (row_shard, plugs.ShardSplit),
                       (rejection_verify, plugs.Verifier)):
        assert check("x", obj, proto) is obj


# ---------------------------------------------------------------- one plugged object per plug point, missing a part

class StudentPolicy:
    def admit(self, waiting, running):  # budget forgotten
        return []


class NoBackend:
    def can_allocate(self, seq): return True
    def allocate(self, seq): pass
    def free(self, seq): pass


class HalfGrowing(NoBackend):
    def backend(self, seqs, new_tokens): pass
    def can_append(self, seq): return True


class NoTruncate(NoBackend):
    def backend(self, seqs, new_tokens): pass


class NoCover(HalfGrowing):
    def append_slot(self, seq): pass
    def truncate(self, seq, num_positions): pass


class NoFork:
    def __init__(self):
        self.block_tables = {}
    def can_allocate(self, seq): return True
    def allocate(self, seq): pass
    def can_append(self, seq): return True
    def append_slot(self, seq): pass
    def free(self, seq): pass


class Lab05Manager(NoFork):
    def fork(self, parent, child): pass


class BadRegister(Lab05Manager):
    def register(self, seq):
        pass


class NoQuantize:
    def dequantize(self, state, rows=None): pass


class NoRelease:
    def propose(self, seqs, gammas): return [], []


class Cache:
    def __init__(self, config, max_len, dtype, device):
        self.length = 0


class NoAdvance:
    def __init__(self, caches, new_tokens):
        self.caches = caches
    def positions(self, device): return torch.zeros(0, dtype=torch.long)
    def attend(self, layer, q, k, v): return q


class NoStepTime:
    pass


def rollback_kv(cfg):
    return EngineConfig(kv=PagedKV(cfg, 4, 4, block_manager=Lab05Manager()), speculative_model="draft",
                        num_speculative_tokens=2)


def speculative_decoder(cfg):
    from miniengine.spec.decoding import SpeculativeDecoder
    return SpeculativeDecoder(None, PagedKV(cfg, 4, 4), None, 2, "coupled", max_num_seqs=1, kv_cache_tokens=16,
                              block_size=4, proposer=NoRelease())


def attention_backend(cfg):
    from miniengine import LLM
    LLM(kv=PerSequenceKV(Cache, NoAdvance, cfg, torch.float32, "cpu")).generate([[1, 2]], SamplingParams(max_tokens=1))


def gqa_pool(cfg):
    from miniengine.gqa import convert
    convert(None, 2, pool=lambda weight, num_heads: weight)  # the pool is checked before the model is looked at


def tensor_parallel(cfg, **fields):
    from miniengine import LLM
    from miniengine.distributed import Plan
    LLM(tensor_parallel_size=2, tensor_parallel_plan=Plan(**fields))


class NoSendable:
    def find_stop(self, text, stops):
        return None


MESSAGES = {  # protocol: (how it is plugged in, the message)
    plugs.BatchSampler: (lambda cfg: EngineConfig(sampler=3),
                         "sampler: int is not callable as sampler(logits, params, positions) (Lab 01)"),
    plugs.RowSampler: (lambda cfg: PerRowSampler(lambda row, params: 0),
                       "sample: <lambda> takes (row, params), but the engine calls sample(logits_row, params, position) "
                       "(Lab 01)"),
    plugs.KVLayout: (lambda cfg: EngineConfig(kv=NoBackend()),
                     "kv: NoBackend has no backend(seqs, new_tokens) (Labs 02, 05)"),
    plugs.GrowingKVLayout: (lambda cfg: EngineConfig(kv=HalfGrowing()), "kv: HalfGrowing has no append_slot(seq) (Lab 05)"),
    plugs.AttentionBackend: (attention_backend,
                             "kv.backend(seqs, new_tokens): NoAdvance has no advance() (Labs 02, 05)"),
    plugs.CacheFactory: (lambda cfg: PerSequenceKV(NoBackend, NoAdvance, cfg, torch.float32, "cpu"),
                         "cache_class: NoBackend takes (), but the engine calls "
                         "cache_class(config, max_len, dtype, device) (Lab 02)"),
    plugs.BackendFactory: (lambda cfg: PerSequenceKV(Cache, Cache, cfg, torch.float32, "cpu"),
                           "backend_class: Cache takes (config, max_len, dtype, device), but the engine calls "
                           "backend_class(caches, new_tokens) (Lab 02)"),
    plugs.ForwardCostModel: (lambda cfg: check("model", NoStepTime(), plugs.ForwardCostModel),
                             "model: NoStepTime has no forward(new_tokens, context) (Lab 03)"),
    plugs.SchedulingPolicy: (lambda cfg: EngineConfig(scheduling_policy=StudentPolicy()),
                             "scheduling_policy: StudentPolicy.admit takes (waiting, running), but the engine calls "
                             "admit(waiting, running, budget) (Lab 04)"),
    plugs.BlockAllocator: (lambda cfg: PagedKV(cfg, 4, 4, block_manager=NoFork()),
                           "block_manager: NoFork has no fork(parent, child) (Lab 05)"),
    plugs.HistoryGather: (lambda cfg: PagedKV(cfg, 4, 4, gather=lambda cache, block_tables: cache),
                          "gather: <lambda> takes (cache, block_tables), but the engine calls "
                          "gather(cache, block_tables, num_keys) (Lab 05)"),
    plugs.Proposer: (speculative_decoder, "proposer: NoRelease has no release(live_seq_ids) (Lab 06)"),
    plugs.Verifier: (lambda cfg: EngineConfig(speculative_model="draft", num_speculative_tokens=2,
                                              speculative_verifier=lambda target_logits, drafts, params, positions: []),
                     "speculative_verifier: <lambda> takes (target_logits, drafts, params, positions), but the engine "
                     "calls verify(target_logits, drafts, draft_probs, params, positions) (Lab 06)"),
    plugs.SpeculativeKV: (lambda cfg: EngineConfig(kv=NoTruncate(), speculative_model="draft", num_speculative_tokens=2),
                          "kv: NoTruncate has no truncate(seq, num_positions) (Lab 06)"),
    plugs.LookaheadKV: (lambda cfg: EngineConfig(kv=NoCover(), speculative_model="draft", num_speculative_tokens=2),
                        "kv: NoCover has no can_cover(seq, num_positions) (Lab 06)"),
    plugs.RollbackBlockAllocator: (rollback_kv, "kv.block_manager: Lab05Manager has no truncate(seq, num_tokens) (Lab 06)"),
    plugs.QuantScheme: (lambda cfg: EngineConfig(quantization=NoQuantize()),
                        "quantization: NoQuantize has no quantize(weight) (Lab 07)"),
    plugs.KVHeadPool: (gqa_pool, "pool: <lambda> takes (weight, num_heads), but the engine calls "
                                 "pool(weight, num_heads, kv_heads) (Lab 07)"),
    plugs.PrefixCache: (lambda cfg: PagedKV(cfg, 4, 4, block_manager=BadRegister()),
                        "block_manager: BadRegister.register takes (seq), but the engine calls "
                        "register(seq, num_tokens) (Lab 08)"),
    plugs.ChunkingRule: (lambda cfg: EngineConfig(enable_chunked_prefill=lambda seq: 1),
                         "enable_chunked_prefill: <lambda> takes (seq), but the engine calls chunk(seq, tokens_left) "
                         "(Lab 08)"),
    plugs.ShardSplit: (lambda cfg: tensor_parallel(cfg, column_shard=lambda weight, rank: weight),
                       "tensor_parallel_plan.column_shard: <lambda> takes (weight, rank), but the engine calls "
                       "column_shard(weight, rank, world_size) (Lab 09)"),
    plugs.AllReduce: (lambda cfg: tensor_parallel(cfg, all_reduce=lambda tensor: tensor),
                      "tensor_parallel_plan.all_reduce: <lambda> takes (tensor), but the engine calls "
                      "all_reduce(tensor, comm) (Lab 09)"),
    plugs.LogitsProcessor: (lambda cfg: EngineConfig(logits_processor=lambda logits_row, params: logits_row),
                            "logits_processor: <lambda> takes (logits_row, params), but the engine calls "
                            "process(logits_row, prompt_ids, output_ids, params) (Lab 10)"),
    plugs.StopStrings: (lambda cfg: EngineConfig(stop_strings=NoSendable()),
                        "stop_strings: NoSendable has no sendable(text, stops, finished) (Lab 10)"),
}


def test_every_plug_point_has_a_message_test():
    assert set(MESSAGES) == set(PROTOCOLS)


@pytest.mark.parametrize("proto", PROTOCOLS, ids=lambda p: p.__name__)
def test_a_plug_missing_a_method_is_named_with_its_lab(proto, cfg):
    plug, message = MESSAGES[proto]
    with pytest.raises(PlugError) as e:
        plug(cfg)
    assert str(e.value) == message
    assert isinstance(e.value, TypeError) and isinstance(e.value, ValueError)  # either kind of handler catches it


def test_a_class_plugged_where_an_instance_belongs_is_named():
    from miniengine.engine import ContinuousBatching
    with pytest.raises(PlugError, match=r"^scheduling_policy: ContinuousBatching is a class; plug in an instance, "
                                        r"ContinuousBatching\(\.\.\.\) \(Lab 04\)$"):
        EngineConfig(scheduling_policy=ContinuousBatching)


def test_the_simulator_checks_its_policy_through_the_scheduler():
    from miniengine.serving import simulator as sim
    with pytest.raises(PlugError, match=r"^policy: StudentPolicy.admit takes \(waiting, running\)"):
        sim.simulate(sim.chat_workload(2, 1.0), StudentPolicy(), None)


def test_the_simulator_checks_its_cost_model():
    from miniengine.serving import simulator as sim

    class StudentCostModel:
        def forward(self, new_tokens):
            return None

    with pytest.raises(PlugError, match=r"^model: StudentCostModel.forward takes \(new_tokens\), but the engine calls "
                                        r"forward\(new_tokens, context\) \(Lab 03\)$"):
        sim.simulate(sim.chat_workload(2, 1.0), sim.FCFS(), StudentCostModel())
    with pytest.raises(PlugError, match=r"^model: object has no forward\(new_tokens, context\) \(Lab 03\)$"):
        sim.simulate(sim.chat_workload(2, 1.0), sim.FCFS(), object())


def test_the_shortcuts_stay():
    EngineConfig(kv_layout="contiguous", quantization="int8", enable_chunked_prefill=True)
    EngineConfig(speculative_model="draft", num_speculative_tokens=2, speculative_verifier="rejection")
