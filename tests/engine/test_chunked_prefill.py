"""Chunked prefill (Scheduler(chunk_prefill=...), LLM(enable_chunked_prefill=...)): exact, and chunked as promised."""
from __future__ import annotations

import pytest

from miniengine import LLM, SamplingParams

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


def serve(golden, **kwargs):
    cases = golden["cases"]
    llm = LLM(**kwargs)
    return cases, llm, llm.generate([c["prompt_token_ids"] for c in cases], [SamplingParams(**c["params"]) for c in cases])


@pytest.mark.parametrize("kwargs", [
    dict(enable_chunked_prefill=True, max_num_batched_tokens=8),
    dict(enable_chunked_prefill=True, max_num_batched_tokens=8, kv_layout="contiguous"),
    dict(enable_chunked_prefill=lambda seq, left: min(3, seq.num_new_tokens, left), max_num_batched_tokens=16),
], ids=["paged", "contiguous", "chunks-of-3"])
def test_golden_cases_stay_exact_when_prompts_are_fed_in_chunks(golden, kwargs):
    cases, _, outs = serve(golden, **kwargs)
    for c, o in zip(cases, outs):
        assert o.token_ids == c["token_ids"], c["name"]
        # each prompt token is fed once, whatever the chunks: Lp + Lo - 1 in all
        assert o.tokens_processed == len(c["prompt_token_ids"]) + len(c["token_ids"]) - 1, c["name"]


def test_chunks_with_the_prefix_cache_and_memory_pressure(golden):
    cases = golden["cases"]
    llm = LLM(enable_chunked_prefill=True, max_num_batched_tokens=24, enable_prefix_caching=True, block_size=4,
              kv_cache_tokens=128)
    for _ in range(2):
        outs = llm.generate([c["prompt_token_ids"] for c in cases], [SamplingParams(**c["params"]) for c in cases])
        assert [o.token_ids for o in outs] == [c["token_ids"] for c in cases]
    assert llm.engine.scheduler.num_preemptions > 0 and llm.engine.kv.block_manager.hit_tokens > 0


def test_decodes_go_first_and_a_long_prompt_gets_its_first_token_after_its_last_chunk(target):
    llm = LLM(model=target, enable_chunked_prefill=True, max_num_batched_tokens=10)
    engine = llm.engine
    short = engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    engine.step()  # the short prompt's prefill
    long = engine.add_request(list(range(40, 65)), SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    fed = []
    while len(long.output_token_ids) == 0:
        batch = engine.scheduler.schedule(engine.clock())
        fed.append(dict(zip([s.seq_id for s in batch.seqs], batch.num_new_tokens)))
        engine.scheduler.postprocess(batch, engine.runner.run(batch))
    # every step: the running decode feeds its token first, the 25-token prompt takes what is left of 10
    assert fed == [{short.seq_id: 1, long.seq_id: 9}, {short.seq_id: 1, long.seq_id: 9}, {short.seq_id: 1, long.seq_id: 7}]
    assert len(short.output_token_ids) == 1 + 3  # the decode never waited for the long prefill


def test_a_prompt_longer_than_the_step_budget_needs_chunking(target):
    prompt = list(range(10, 40))
    with pytest.raises(ValueError, match="len\\(prompt\\) must be <= max_num_batched_tokens=16"):
        LLM(model=target, max_num_batched_tokens=16).generate([prompt], SamplingParams(max_tokens=2))
    plain = LLM(model=target).generate([prompt], SamplingParams(temperature=0, max_tokens=5))
    chunked = LLM(model=target, max_num_batched_tokens=16, enable_chunked_prefill=True).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=5))
    assert chunked[0].token_ids == plain[0].token_ids


def test_a_chunking_rule_that_breaks_the_budget_is_named(target):
    llm = LLM(model=target, max_num_batched_tokens=8, enable_chunked_prefill=lambda seq, left: left + 1)
    with pytest.raises(RuntimeError, match="the chunking rule returned 9 .* it must be an int in \\[0, 8\\]"):
        llm.generate([list(range(10, 30))], SamplingParams(max_tokens=2))


@pytest.mark.parametrize("kwargs, words", [
    (dict(enable_chunked_prefill="yes"), "enable_chunked_prefill must be True, False or a function"),
    (dict(enable_chunked_prefill=True, speculative_model="draft", num_speculative_tokens=2),
     "cannot be combined with a speculative_model"),
])
def test_bad_chunked_prefill_settings_are_named(kwargs, words, target):
    with pytest.raises(ValueError, match=words):
        LLM(model=target, **kwargs)


@pytest.mark.slow  # a whole benchmark or regeneration: make test runs it, make quick does not
def test_bench_chunked_prints_both_tables_and_the_summary_line():
    """The benchmark itself, one seed (its numbers are measurements, not assertions)."""
    import re
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "miniengine", "bench", "chunked", "--seeds", "1"], capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert sum(line.startswith(("simulator ", "cpu ")) for line in lines) == 4  # two modes in each place
    assert re.fullmatch(r"chunked prefill: decode ITL P99 \d+\.\dx lower on the simulator, \d+\.\dx lower on this CPU "
                        r"\(medians of 1 seeds\); long-prompt TTFT P50 \d+\.\d\dx and \d+\.\d\dx", lines[-1]), lines[-1]
