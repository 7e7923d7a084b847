"""Your saved parts of labs 01-09 as objects a server's plug flags can name: ``--sampler
autograder.labs.lab10.served:sampler``, ``--kv ...:kv``, ``--scheduling-policy ...:scheduling_policy``,
``--enable-chunked-prefill ...:chunk``.

``python -m miniengine serve`` imports this module in its own process and reads the attribute a flag names; each is
built then from your saved modules, the way ``own.my_engine`` plugs them (autograder/own/assemble.py). Which parts are
yours:

* outside grading, mine/ (``autograder.own``): a part whose saved module defines it and whose lab's visible tests,
  as ``check`` or a lab's last cell recorded them, did not fail; nothing is run here;
* under grading, the mine/ folder handed in beside the notebook, which the grader mounts read-only in the sandbox
  and names in ``$MINIENGINE_MINE`` (autograder/grade/submissions.py): every part a module there defines, as it is.
  Results a student's own machine recorded prove nothing to the grader, so none is read: the golden completions
  decide, and a saved part that is wrong costs Task 3's points. A part that no module defines (or a module that does
  not run) is the course's, and the test's output says so. No mine/ handed in: every part is the course's.

``yours()`` says, in the kernel, which attributes hold a part of yours.
"""
from __future__ import annotations

# EngineConfig field -> the attribute of this module that holds your part for it.
PLUGS = {"sampler": "sampler", "kv": "kv", "scheduling_policy": "scheduling_policy", "enable_chunked_prefill": "chunk"}
# The parts (autograder/own/registry.py keys) each attribute is built from.
NEEDS = {"sampler": ("sampler",), "kv": ("prefix_cache", "block_manager", "gather"), "scheduling_policy": ("policy",),
         "chunk": ("chunk",)}
KEYS = [k for keys in NEEDS.values() for k in keys]


def _verdicts() -> dict:
    """{part key: Verdict} of the parts that are yours, their objects loaded (the saved modules are run)."""
    from autograder.own import parts, registry

    if registry.grading():
        return _handed_in(run=True)
    try:
        return {k: v for k, v in parts.judge_up_to(9, live=False).items() if v.yours}
    except Exception:  # nothing saved, or a saved module that does not load: the course's parts
        return {}


def _handed_in(run: bool) -> dict:
    """Under grading, the parts the mine/ handed in defines: {key: module file name}, read without running anything
    (``run=False``: the kernel's view), or {key: Verdict} with the objects, each module run (``run=True``: in the
    server's process only, so that none of it runs in the kernel during a test). A module that defines a part but
    does not run raises, naming it: the server then refuses to start, with that reason. {} when no mine/ was handed
    in: the grader then sets no $MINIENGINE_MINE, and no other mine/ is read."""
    import os

    from autograder.own import parts, registry, source, status

    if not os.environ.get("MINIENGINE_MINE"):
        return {}
    out = {}
    for lab in range(1, 10):
        path = status.module_path(lab)
        if not path.is_file():
            continue
        defined = source.defines(path.read_text(encoding="utf-8", errors="replace"))
        mine = [p for p in registry.parts_of(lab) if p.key in KEYS and set(p.names) <= defined]
        if not mine or not run:
            out.update({p.key: path.name for p in mine})
            continue
        module = status.load(lab)
        if module.ns is None:
            raise RuntimeError(f"your handed-in {module.error} (it defines {', '.join(p.title for p in mine)})")
        gone = [n for p in mine for n in p.names if not source.notebook_defined(module.ns.get(n))]
        if gone:
            raise RuntimeError(f"your handed-in {path.name} defines {', '.join(gone)}, but running it leaves no "
                               f"function or class of that name")
        for p in mine:
            out[p.key] = parts.Verdict(p, True, f"handed in as {path.name}", {n: module.ns[n] for n in p.names})
    return out


def yours() -> list[str]:
    """The attributes that hold a part of yours (under grading: of the mine/ handed in, read, not run)."""
    from autograder.own import registry

    mine = _handed_in(run=False) if registry.grading() else _verdicts()
    return [attr for attr, keys in NEEDS.items() if any(k in mine for k in keys)]


def handed_in_report() -> str:
    """Under grading, a line for the test's output: which plugged parts are the handed-in mine/'s, which the course's
    ("" outside grading, where the printed list of your parts says it)."""
    import os

    from autograder.own import registry

    if not registry.grading():
        return ""
    if not os.environ.get("MINIENGINE_MINE"):
        return "no mine/ was handed in with this notebook: every part served was the course's"
    mine = _handed_in(run=False)
    titles = {p.key: p for p in registry.PARTS}
    said = [f"{titles[k].title} ({mine[k]})" for k in KEYS if k in mine
            and not (k == "block_manager" and "prefix_cache" in mine)]  # a prefix cache takes its place (assemble.py)
    course = [f"{titles[k].title} (no mine/lab{titles[k].lab:02d}.py defines {', '.join(titles[k].names)})"
              for k in KEYS if k not in mine]
    return (f"parts served from the mine/ handed in: {', '.join(said) or 'none'}; the course's: "
            f"{', '.join(course) or 'none'}")


_LOADED: dict = {}  # (grading, $MINIENGINE_MINE) -> _verdicts(), in the server's process


def _loaded() -> dict:
    """_verdicts(), once per process and place: the server reads up to four attributes of this module, and a saved
    module can take seconds to run (lab 04's replays its numbers' simulations, 2 s), so each runs once, not four
    times (a server with all four parts of a saved solution plugged: 9.6 s to start before, 3.7 s now)."""
    import os

    from autograder.own import registry

    key = (registry.grading(), os.environ.get("MINIENGINE_MINE"))
    if key not in _LOADED:
        _LOADED[key] = _verdicts()
    return _LOADED[key]


def _build(name: str):
    from autograder.own import assemble
    from miniengine import kv, plugs
    from miniengine.layers.sampler import PerRowSampler
    from miniengine.plugs.conformance import check

    mine = _loaded()
    if name == "sampler":
        return PerRowSampler(mine["sampler"].objects["sample"])
    if name == "scheduling_policy":
        return check("scheduling_policy", mine["policy"].objects["ContinuousBatching"](), plugs.SchedulingPolicy)
    if name == "chunk":
        return check("enable_chunked_prefill", mine["chunk"].objects["chunk"], plugs.ChunkingRule)
    if name == "kv":
        config = assemble._target().config
        manager = None
        if "prefix_cache" in mine:
            manager = check("block_manager", mine["prefix_cache"].objects["PrefixCache"](
                assemble.NUM_BLOCKS, assemble.BLOCK_SIZE), plugs.PrefixCache)
        elif "block_manager" in mine:
            manager = check("block_manager", mine["block_manager"].objects["BlockManager"](
                assemble.NUM_BLOCKS, assemble.BLOCK_SIZE), plugs.BlockAllocator)
        gather = mine["gather"].objects["gather_history"] if "gather" in mine else None
        return kv.PagedKV(config, assemble.NUM_BLOCKS, assemble.BLOCK_SIZE, block_manager=manager, gather=gather,
                          enable_prefix_caching=manager is None)
    raise AttributeError(name)


def __getattr__(name: str):
    if name in NEEDS:
        return _build(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
