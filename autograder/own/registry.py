"""The part registry: which notebook names form which part of the engine, and how each part plugs in.

A *part* is what one plug point of the engine takes (``miniengine/plugs/__init__.py``), made of names a lab's notebook
defines: Lab 01's sampler is ``sample`` (with the ``greedy``, ``top_k_mask`` and ``top_p_mask`` it calls, found
by following its code), Lab 05's paged layout is ``BlockManager`` and ``gather_history``.  ``KIND`` says what
``own.my_engine`` does with a part:

* ``plugged``: inside the token-exact ``LLM`` (the student's when theirs passes its visible tests);
* ``clock``: the simulator's cost model, ``own.my_cost_model(config)``, not inside ``LLM``;
* ``lossy``: shown beside the token-exact run, never inside it (its tokens may differ by design);
* ``apart``: written and saved, but not a plug of this ``LLM``; ``note`` says why.

Grade ids in ``HEAVY`` are visible tests that serve the engine for seconds each: a lab's last cell does not rerun
them (the golden run it makes checks the same thing); ``check`` records their results.
"""
from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

PLUGGED, CLOCK, LOSSY, APART = "plugged", "clock", "lossy", "apart"


@dataclasses.dataclass(frozen=True)
class Part:
    key: str     # the part's id, used by assemble.py
    lab: int
    title: str   # what the table calls it
    names: tuple  # the notebook names the part needs (what it calls is followed from their code)
    kind: str = PLUGGED
    note: str = ""  # for parts that are not plugged: why, in a few words
    course: bool = True  # False for a design part: the course's engine has none to fall back on

    @property
    def lab_id(self) -> str:
        return f"lab{self.lab:02d}"


PARTS = (
    Part("sampler", 1, "sampler", ("sample",)),
    Part("search", 1, "completion search", ("search_completion",), APART,
         "a decoding loop of its own, no plug point", course=False),
    Part("kv_cache", 2, "KV cache", ("ContiguousKVCache", "CachedAttention")),
    Part("lowbit_kv", 2, "low-bit KV cache", ("LowBitKVCache", "LowBitAttention"), LOSSY,
         "lossy: the lab's next cell shows it", course=False),
    Part("roofline", 3, "cost model (paper GPU)", ("forward_flops", "forward_bytes", "step_time"), CLOCK,
         "own.my_cost_model(config, gpu='H100')"),
    Part("calibrated", 3, "cost model (the course's CPU)", ("calibrate",), CLOCK, "own.my_cost_model(config)", course=False),
    Part("policy", 4, "scheduling policy", ("ContinuousBatching",)),
    Part("static", 4, "static batching", ("StaticBatching",), APART,
         "the baseline ContinuousBatching is measured against"),
    Part("block_manager", 5, "block manager", ("BlockManager",)),
    Part("gather", 5, "paged gather", ("gather_history",)),
    Part("paged_search", 5, "completion search on paged memory", ("paged_search",), APART,
         "a search of its own on a session of the paged pool, no plug point", course=False),
    Part("verifier", 6, "speculative verifier", ("rejection_verify",), APART,
         "exact in distribution, not token for token: Lab 06's engine cell runs it"),
    Part("rollback", 6, "KV rollback (truncate)", ("BlockManager",), APART,
         "used when speculating, which excludes your sampler and chunked prefill"),
    Part("proposer", 6, "prompt-lookup proposer", ("PromptLookupProposer",), APART,
         "drafts only when speculating, which excludes your sampler: Lab 06's measurement cell runs it", course=False),
    Part("int4", 7, "int4 weights", ("Int4GroupWise",), LOSSY, "lossy: Lab 07's engine cell serves it"),
    Part("gqa", 7, "GQA conversion", ("mean_pool_kv",), LOSSY, "lossy: a converted model, with tokens of its own"),
    Part("prefix_cache", 8, "prefix cache", ("PrefixCache",)),
    Part("chunk", 8, "chunking rule", ("chunk",)),
    Part("tp_plan", 9, "tensor-parallel plan", ("column_shard", "row_shard", "ring_all_reduce"), APART,
         "ranks run the course's engine and take no other plug: Lab 09's engine cell runs it"),
    Part("serve_flags", 10, "serving flags", ("serve_flags",), APART,
         "glue, not an engine part: Lab 10's tests start `serve` with your flags and your parts"),
    Part("stream_client", 10, "streaming client", ("stream_completion",), APART, "a client of the server, not a part of it"),
    Part("logits_processor", 10, "penalties and min_p", ("process_row",), APART,
         "a plug of the server (--logits-processor): Lab 10's Task 4 serves it"),
    Part("stop_rules", 10, "stop strings", ("StopRules",), APART,
         "a plug of the server (--stop-strings): Lab 10's Task 4 serves it"),
    Part("serving_config", 10, "serving configuration", ("serving_config",), APART,
         "priced on the simulator: Lab 10's design part", course=False),
)

# Visible tests that run the engine for seconds each (measured on a 2-core machine: 2 to 28 s), left to `check`.
# Only plugged and clock parts run tests in a last cell; the others show what `check` recorded.
HEAVY = {
    "lab01": {"engine-visible"},
    "lab02": {"engine-visible"},
    "lab04": {"engine-visible", "replay-visible"},
    "lab05": {"engine-visible", "sharing-visible"},
    "lab08": {"engine-visible", "chunk-visible"},
}

# Which layout serves the KV cache: the latest lab at or below N that has one supersedes the earlier ones.
KV_LABS = (5, 2)
LAST_LAB = 10


def parts_of(lab: int) -> list[Part]:
    return [p for p in PARTS if p.lab == lab]


def parts_up_to(lab: int) -> list[Part]:
    return [p for p in PARTS if p.lab <= lab]


def lab_number(lab) -> int:
    """``"lab03"`` (or ``"lab03_roofline"``, or 3) -> 3; anything else is refused with the allowed form."""
    if isinstance(lab, int) and not isinstance(lab, bool):
        number = lab
    else:
        m = re.fullmatch(r"lab(\d\d)(_\w+)?", str(lab))
        if not m:
            raise ValueError(f"lab must be a lab's id such as 'lab03', got {lab!r}")
        number = int(m.group(1))
    if not 1 <= number <= LAST_LAB:
        raise ValueError(f"lab must be lab01 to lab{LAST_LAB:02d}, got {lab!r}")
    return number


def grading() -> bool:
    """Is nbgrader grading this kernel (or `check` previewing a grade, which sets the same variable)?"""
    return bool(os.environ.get("NBGRADER_EXECUTION"))


def mine_dir() -> Path:
    """Where the student's modules live: $MINIENGINE_MINE, else mine/ at the root of this course checkout."""
    from autograder import course_paths

    where = os.environ.get("MINIENGINE_MINE")
    return Path(where).expanduser().resolve() if where else course_paths.REPO_ROOT / "mine"


def lab_notebook(lab: int) -> Path | None:
    """The lab's notebook in labs/ (the source here, the released one in the student edition), if there is one."""
    from autograder import course_paths

    found = [lab_.source for lab_ in course_paths.all_labs() if lab_.name.startswith(f"lab{lab:02d}_")]
    return found[0] if found else None
