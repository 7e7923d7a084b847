"""Helpers that the labs' test cells import: strict conversions, the reference guard, golden logits.

A test cell starts with ``importlib.reload(checks)``, so whatever an earlier
cell did to this module's functions is undone before the tests use them.  The
tests themselves read the golden files with ``json`` and compare plain Python
values; nothing here computes an expected answer.

Why each helper exists:
  * ``as_token`` / ``as_mask`` turn a student's output into plain ints and bools
    first, so an object whose ``__eq__`` always returns True cannot pass.
  * ``reference_forbidden`` makes the course's reference sampler and decoder
    fail loudly while a test runs, however the student imported or renamed them.
  * ``golden_logits`` gives the logits at every step of a golden run from one
    float64 forward pass, so the sampler tests cost one forward per case.
  * ``course_parts_under`` lends a test the course's versions of the earlier
    tasks that the function under test calls by name, so that one mistake
    costs only the task it is in.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import numbers
import operator

import numpy as np
import torch

from miniengine import paths as _paths

# Re-read the paths module too: a cell that set ``paths.GOLDEN = ...`` must not move the tests' files.
_paths = importlib.reload(_paths)
VISIBLE_GOLDEN = _paths.GOLDEN / "visible.json"
HIDDEN_GOLDEN = _paths.REPO_ROOT / "autograder" / "hidden" / "golden.json"
TARGET = _paths.TARGET

# The reference implementations a lab asks students to write themselves
# (autograder/README.md, Rules inside the notebooks).
FORBIDDEN = {
    "miniengine.reference": ["naive_generate"],
    "miniengine.sampling": ["sample_token", "top_k_mask", "top_p_mask", "processed_logits", "softmax"],
}


class ReferenceCalled(BaseException):
    """Raised inside the reference while a test runs.

    A BaseException, not an Exception, so that a student's ``except Exception``
    cannot swallow it and fall back to something else unnoticed.
    """


_calls: list[str] = []


def forbidden_call(name: str):
    _calls.append(name)
    raise ReferenceCalled(f"{name} is the course's reference implementation; this lab asks you to write your own")


def _raising_code(name: str, freevars: tuple[str, ...]):
    """Code for a function that reports a forbidden call, with the same free variables as the one it replaces.

    The replacement runs with the victim's globals, so it reaches this module through sys.modules.
    """
    inner = (f"    def _forbidden(*args, **kwargs):\n"
             + "".join(f"        {v}\n" for v in freevars)  # mention each free variable so the counts match
             + f"        __import__('sys').modules[{__name__!r}].forbidden_call({name!r})\n")
    src = "def _factory():\n" + "".join(f"    {v} = None\n" for v in freevars) + inner + "    return _forbidden\n"
    scope: dict = {}
    exec(compile(src, f"<forbidden {name}>", "exec"), scope)
    return scope["_factory"]().__code__


def _functions(fn):
    """The function and every function it wraps (decorators such as torch.no_grad keep the original in __wrapped__)."""
    while inspect.isfunction(fn):
        yield fn
        fn = getattr(fn, "__wrapped__", None)


class AnswerKeyError(LookupError):
    """An answer-key name that names nothing: the guard would silently not guard it, so this stops the test."""


def _resolve(module, dotted: str):
    """``name`` or ``Class.method`` in a module; a property gives its getter, a static or class method its function.

    A name that does not exist raises AnswerKeyError: after a move or a rename, a guard that skipped it would let
    a submission call the course's code unnoticed.
    """
    obj, missing = module, object()
    for i, part in enumerate(dotted.split(".")):
        obj = inspect.getattr_static(obj, part, missing) if inspect.isclass(obj) else getattr(obj, part, missing)
        if obj is missing:
            where = ".".join(dotted.split(".")[:i]) or "the module"
            raise AnswerKeyError(f"answer key names {module.__name__}.{dotted}, but {where} has no {part!r}: "
                                 f"the course's code moved or was renamed; fix the lab's answer key")
    if isinstance(obj, property):
        return obj.fget
    return obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj


@contextlib.contextmanager
def reference_forbidden(what: str = "your code", forbidden: dict[str, list[str]] | None = None):
    """While inside, every forbidden reference function raises, under whatever name it is called.

    Swapping ``__code__`` changes the function object itself, so aliases
    (``from miniengine.sampling import top_k_mask as mine``) are caught as well.
    ``forbidden`` maps module names to the names a lab forbids (``FORBIDDEN`` by default);
    a name may be ``Class.method`` or ``Class.property``.
    """
    swapped = []
    for module_name, names in (FORBIDDEN if forbidden is None else forbidden).items():
        module = importlib.import_module(module_name)
        for name in names:
            functions = list(_functions(_resolve(module, name)))
            if not functions:
                raise AnswerKeyError(f"answer key names {module_name}.{name}, which is not a function or method: "
                                     f"list the functions to forbid (a class's methods as Class.method)")
            for fn in functions:
                swapped.append((fn, fn.__code__))
                fn.__code__ = _raising_code(f"{module_name}.{name}", fn.__code__.co_freevars)
    del _calls[:]
    try:
        yield
    except ReferenceCalled:
        pass  # reported below, as a test failure rather than a crash
    finally:
        for fn, code in swapped:
            fn.__code__ = code
    if _calls:
        called = ", ".join(sorted(set(_calls)))
        raise AssertionError(f"{what} calls {called}: that is the course's reference implementation. "
                             f"Write this part yourself (the allowed imports are listed at the top of the lab).")


def require_own(fn, name: str):
    """A graded function must be a plain function defined in this notebook, not imported."""
    assert callable(fn), f"{name} must be a function, got {type(fn).__name__}"
    assert inspect.isfunction(fn), f"{name} must be a function written with def in this notebook, got {type(fn).__name__}"
    module = getattr(fn, "__module__", None)
    assert module == "__main__", (
        f"{name} must be defined in this notebook, but it comes from module {module!r}: write it yourself")


def as_token(x, what: str) -> int:
    """A token id as a plain int: ints, numpy integers and 0-d integer tensors qualify; floats and bools do not."""
    if isinstance(x, (bool, np.bool_)):
        raise AssertionError(f"{what}: expected a token id (an integer), got the bool {x!r}")
    if isinstance(x, torch.Tensor) and x.numel() == 1 and not x.is_floating_point():
        x = x.item()
    try:
        value = operator.index(x)
    except TypeError:
        raise AssertionError(f"{what}: expected a token id (an integer), got {type(x).__name__} {x!r:.60}") from None
    return int(value)


def as_tokens(xs, what: str) -> list[int]:
    if isinstance(xs, (str, bytes)) or not hasattr(xs, "__iter__"):
        raise AssertionError(f"{what}: expected a list of token ids, got {type(xs).__name__}")
    return [as_token(x, f"{what}[{i}]") for i, x in enumerate(list(xs))]


def as_mask(x, n: int, what: str) -> list[bool]:
    """A keep-mask as a list of n plain bools; numpy and torch boolean arrays qualify."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype != np.bool_:
        raise AssertionError(f"{what}: expected a boolean array (True = keep), got dtype {arr.dtype}")
    if arr.shape != (n,):
        raise AssertionError(f"{what}: expected shape ({n},), one entry per logit, got {arr.shape}")
    return [bool(v) for v in arr.tolist()]


def as_count(x, what: str) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (numbers.Integral, np.integer, torch.Tensor)):
        raise AssertionError(f"{what}: expected an integer, got {type(x).__name__} {x!r:.60}")
    return as_token(x, what)


def load_model(dtype=torch.float32):
    """A fresh copy of the target model on the CPU: float32 to decode with, float64 for the tests' logits."""
    from miniengine.model import load_model as _load

    return _load(TARGET, dtype=dtype)


def load_tokenizer():
    from miniengine.tokenizer import load_tokenizer as _load

    return _load(TARGET)


@torch.no_grad()
def golden_logits(model64, case) -> np.ndarray:
    """Row t holds the float64 logits that predict generated token t of a golden case.

    One causal forward pass over prompt + generated tokens gives every step's logits at once:
    row Lp-1+t sees exactly the prefix that step t of naive decode sees.
    """
    from miniengine.attention import NoCacheBackend

    prompt, tokens = case["prompt_token_ids"], case["token_ids"]
    ids = prompt + tokens[:-1]
    n = len(ids)
    logits = model64(torch.tensor(ids), torch.arange(n), NoCacheBackend([n]))
    return logits[len(prompt) - 1:].numpy()


@torch.no_grad()
def prompt_logits(model64, case) -> np.ndarray:
    """The float64 logits that predict a case's first generated token: they need only the prompt."""
    from miniengine.attention import NoCacheBackend

    prompt = case["prompt_token_ids"]
    return model64(torch.tensor(prompt), torch.arange(len(prompt)), NoCacheBackend([len(prompt)]))[-1].numpy()


@torch.no_grad()
def free_run(model64, cases: list[dict], pick, eos_token_id: int) -> list[list[int]]:
    """Decode every case with the float64 reference model, choosing each token with ``pick(logits_row, case, step)``.

    ``pick`` is the student's function under test.  Not ``reference.naive_generate``: that is Lab 01's answer key,
    which ``reference_forbidden`` makes fail while these tests run.  Each run follows the student's own tokens, so it needs no
    golden output: when every pick is right it retraces the golden run exactly, and the grader compares.  All
    cases advance together, one ragged forward pass per step, so the cost is the longest run's steps.
    """
    from miniengine.attention import NoCacheBackend

    seqs = [list(c["prompt_token_ids"]) for c in cases]
    outs: list[list[int]] = [[] for _ in cases]
    active = list(range(len(cases)))
    t = 0
    while active:
        lens = [len(seqs[i]) for i in active]
        ids = torch.tensor([tok for i in active for tok in seqs[i]])
        positions = torch.cat([torch.arange(n) for n in lens])
        last = torch.tensor(lens).cumsum(0) - 1
        rows = model64(ids, positions, NoCacheBackend(lens), logits_indices=last).numpy()
        still = []
        for row, i in zip(rows, active):
            params = cases[i]["params"]
            token = pick(row, cases[i], t)
            outs[i].append(token)
            seqs[i].append(token)
            ended = token == eos_token_id and not params.get("ignore_eos", False)
            if not ended and len(outs[i]) < params.get("max_tokens", 16):
                still.append(i)
        active, t = still, t + 1
    return outs


def hidden_inputs(file: str = "golden") -> dict:
    """A hidden golden file's inputs only (prompts, parameters, end-of-text id): never its outputs.

    In the grading sandbox the grader has written these views to the folder named by CASES_ENV, and the
    golden files themselves are not there; an instructor's own run derives the same view from the files.
    """
    import json
    import os

    from . import hidden_spec

    spec = importlib.reload(hidden_spec)
    folder = os.environ.get(spec.CASES_ENV)
    if folder:
        with open(os.path.join(folder, f"{file}.json")) as f:
            return json.load(f)
    return spec.public_view(spec.load(file))


class HiddenReport:
    """What a hidden test cell's run of the student's code produced, on hidden prompts, for the grader to compare.

    ``data(file)`` gives the hidden file's inputs (prompts, parameters, end-of-text id) and ``cases(file)`` the
    cases this cell must report, from autograder.hidden_spec.SPECS.  ``add`` records an output, and ``submit``
    hands the whole report over as one display output that the grader reads from outside the sandbox.  Run by an
    instructor outside the sandbox, where the golden files are readable, ``submit`` also compares at once and
    fails with the grader's own message.
    """

    def __init__(self, lab: str, cell: str):
        from . import hidden_spec

        self._spec = importlib.reload(hidden_spec)
        self.lab, self.cell, self.rows = lab, cell, []
        self._views: dict[str, dict] = {}

    def data(self, file: str = "golden") -> dict:
        if file not in self._views:
            self._views[file] = hidden_inputs(file)
        return self._views[file]

    def cases(self, file: str = "golden", section: str = "cases") -> list[dict]:
        dues = [d for d in self._spec.spec(self.lab, self.cell) if d.file == file and d.section == section]
        assert dues, f"{self.lab}/{self.cell} reports nothing from {file}/{section}"
        seen, picked = set(), []
        for d in dues:
            for c in d.cases(self.data(file)):
                if c["name"] not in seen:
                    seen.add(c["name"])
                    picked.append(c)
        return picked

    def add(self, file: str, case: dict, field: str, value, section: str = "cases") -> None:
        if field == "chosen_logits":
            value = [float(x) for x in value]
        elif field == "completions":
            value = [as_tokens(v, f"case {case['name']}: completion") for v in value]
        elif field == "token_ids":
            value = as_tokens(value, f"case {case['name']}: token_ids")
        self.rows.append([file, section, case["name"], field, value])

    def submit(self) -> None:
        from IPython.display import display

        display({self._spec.MIME: {"cell": self.cell, "outputs": self.rows}}, raw=True)
        files = {d.file for d in self._spec.spec(self.lab, self.cell)}
        try:
            golden = {f: self._spec.load(f) for f in files}
        except OSError:
            return  # the student's sandbox: only the grader can compare
        ok, message = self._spec.judge(self.lab, self.cell, [{"cell": self.cell, "outputs": self.rows}], golden)
        assert ok, message


def show(tok, token_id) -> str:
    """A token id with its text, for messages: 1234 (' return')."""
    try:
        return f"{token_id} ({tok.decode([int(token_id)], skip_special_tokens=False)!r})"  # shows <|endoftext|> too
    except Exception:  # an out-of-range id from a buggy submission: the number alone will do
        return str(token_id)


class RecordingModel:
    """Wraps the model and records what each call feeds it, to check that decode recomputes the prefix."""

    def __init__(self, model):
        self._model = model
        self.calls: list[dict] = []

    def __call__(self, input_ids, positions, backend, *args, **kwargs):
        self.calls.append({
            "n": int(len(input_ids)),
            "ids": [int(t) for t in torch.as_tensor(input_ids).reshape(-1).tolist()],
            "positions": [int(p) for p in torch.as_tensor(positions).reshape(-1).tolist()],
            "backend": type(backend).__name__,
            "seq_lens": list(getattr(backend, "seq_lens", [])),
        })
        return self._model(input_ids, positions, backend, *args, **kwargs)

    forward = __call__

    def __getattr__(self, name):  # config, device, dtype, ... come from the real model
        return getattr(self._model, name)


def check_prefix_recompute(calls: list[dict], prompt: list[int], tokens: list[int], what: str):
    """Step t must feed prompt + tokens[:t] at positions 0..n-1 through a NoCacheBackend([n])."""
    assert len(calls) == len(tokens), (
        f"{what}: generated {len(tokens)} tokens with {len(calls)} model calls; naive decode makes one call per token")
    for t, call in enumerate(calls):
        want = prompt + tokens[:t]
        n = len(want)
        assert call["backend"] == "NoCacheBackend", (
            f"{what}, step {t}: the model was called with a {call['backend']}; use NoCacheBackend([n])")
        assert call["n"] == n and call["ids"] == want, (
            f"{what}, step {t}: expected the whole sequence so far ({n} tokens: the prompt plus {t} generated), "
            f"got {call['n']} tokens" + ("" if call["n"] != n else " with different ids"))
        assert call["positions"] == list(range(n)), (
            f"{what}, step {t}: positions must be 0..{n - 1}, got {call['positions'][:5]}...")
        assert call["seq_lens"] == [n], (
            f"{what}, step {t}: the backend must be NoCacheBackend([{n}]), got seq_lens={call['seq_lens']}")


def tokens_processed(prompt_len: int, n_generated: int) -> int:
    """Σ over steps t = 0..n-1 of (Lp + t): what naive decode feeds the model in total."""
    return sum(prompt_len + t for t in range(n_generated))



def one_case_per_kind(cases: list[dict]) -> list[dict]:
    """One golden case of each kind (greedy, temperature, top_k, ...), each from a different prompt where possible.

    Full decodes are the slow tests, so they cover every sampler once rather than every case.  The hidden tests'
    SPECS pick their cases with the same rule, so this is that rule.
    """
    from . import hidden_spec

    return importlib.reload(hidden_spec).one_per_kind(cases)


# ---------------------------------------------------------------- the course's parts under a graded task
#
# A later task calls the functions of earlier tasks by name: ``sample`` calls ``top_k_mask``, ``naive_decode``
# calls ``sample``, ``cached_decode`` builds a ``ContiguousKVCache``.  So that one mistake costs only its own task,
# a test binds those names to the course's versions while it runs (``course_parts_under``).  The function under
# test is never substituted: a test names only the parts below it.
#
# The course's versions are private copies, made when the test enters ``course_parts_under`` (before
# ``reference_forbidden`` swaps the originals' code): each copied function gets the original's code object and a
# namespace of its own that holds only the module globals it uses.  So the copies run while the originals are
# forbidden, and a mask lent to ``sample``'s test does not lead to the course's whole sampler.  A copy works only
# while the ``course_parts_under`` that made it is active, and making one while the originals are forbidden (from
# inside the code under test) counts as calling the reference.

# notebook name -> (module, name) of the course object lent in its place, or a function defined below
COURSE_PARTS = {
    "greedy": None,  # course_greedy below: the temperature-0 branch of miniengine.sampling.sample_token
    "top_k_mask": ("miniengine.sampling", "top_k_mask"),
    "top_p_mask": ("miniengine.sampling", "top_p_mask"),
    "sample": ("miniengine.sampling", "sample_token"),
    "ContiguousKVCache": ("miniengine.kv.contiguous", "KVCache"),
    "CachedAttention": ("miniengine.kv.contiguous", "CachedBackend"),
    "fits": ("miniengine.engine.policy", "fits"),
    "gather_history": ("miniengine.kv.paged", "gather_history"),
    # Lab 06: the draft model's own cache keeps the course's block manager, whose truncate the lab forbids
    "DraftBlockManager": ("miniengine.kv.block_manager", "BlockManager"),
    # Lab 07: Int4GroupWise's tests run it on the course's packing
    "pack_int4": ("miniengine.layers.quant", "pack_int4"),
    "unpack_int4": ("miniengine.layers.quant", "unpack_int4"),
}
_TAKES_LOGITS = {"greedy", "top_k_mask", "top_p_mask", "sample"}  # lent with their first argument made numpy float64

_live: set = set()  # tokens of the course_parts_under contexts now active; a fresh set whenever this module is reloaded


def _require_live(token, name: str):
    if token not in _live:
        forbidden_call(f"the course's {name} (lent to a test, used outside it)")


def _names_used(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):  # comprehensions, lambdas and nested functions
            names |= _names_used(const)
    return names


def _private_copy(module_name: str, name: str):
    """A copy of a course function or class that runs the original code in namespaces of its own.

    Every course function or class it uses (anything defined in ``miniengine``) is copied too, on demand, into a
    namespace per source module that holds only the names the copies use; numpy, torch and the like are shared.
    """
    import types

    namespaces: dict[int, dict] = {}  # id(a module's globals) -> the namespace of the copies made from that module
    done: dict[int, object] = {}  # id(original) -> its copy

    def namespace(src: dict) -> dict:
        if id(src) not in namespaces:
            namespaces[id(src)] = {"__builtins__": src.get("__builtins__", __builtins__),
                                   "__name__": src.get("__name__"), "__package__": src.get("__package__")}
        return namespaces[id(src)]

    def copied(obj):
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            return obj
        if str(getattr(obj, "__module__", "")).split(".")[0] != "miniengine":
            return obj  # numpy, torch, the standard library: shared, as the original shares them
        if id(obj) not in done:
            (function if inspect.isfunction(obj) else klass)(obj)
        return done[id(obj)]

    def function(fn):
        if fn.__code__.co_filename.startswith("<forbidden"):  # asked for from inside the code under test
            forbidden_call(f"{fn.__module__}.{fn.__qualname__}")
        if hasattr(fn, "__wrapped__") or "__class__" in fn.__code__.co_freevars:
            raise NotImplementedError(f"cannot copy {fn.__module__}.{fn.__qualname__} (a decorated function or super())")
        src = fn.__globals__
        ns = namespace(src)
        copy = types.FunctionType(fn.__code__, ns, fn.__name__, fn.__defaults__, fn.__closure__)
        copy.__kwdefaults__, copy.__qualname__, copy.__doc__ = fn.__kwdefaults__, fn.__qualname__, fn.__doc__
        done[id(fn)] = copy
        for used in sorted(_names_used(fn.__code__)):
            if used not in ns and used in src:
                ns[used] = copied(src[used])
        return copy

    def klass(cls):
        copy = type(cls)(cls.__name__, tuple(copied(b) for b in cls.__bases__),
                         {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
        done[id(cls)] = copy  # before its methods, which may name the class
        for key, value in vars(cls).items():
            if key in ("__dict__", "__weakref__", "__module__", "__qualname__", "__doc__"):
                continue
            if inspect.isfunction(value):
                value = function(value)
            elif isinstance(value, property):
                value = property(*(f and function(f) for f in (value.fget, value.fset, value.fdel)), value.__doc__)
            elif isinstance(value, (staticmethod, classmethod)):
                value = type(value)(function(value.__func__))
            setattr(copy, key, value)
        return copy

    return copied(getattr(importlib.import_module(module_name), name))


def course_greedy(logits):
    """The course's greedy: the id of the largest raw logit, the first on a tie (sample_token at temperature 0)."""
    if isinstance(logits, torch.Tensor):
        logits = logits.detach().cpu().double().numpy()
    return int(np.argmax(np.asarray(logits, dtype=np.float64)))


def _lent_function(fn, name: str, token):
    """fn as the notebook calls it, live only in its test; a sampling part gets numpy float64 logits first
    (a tensor or a list is converted)."""
    def course_part(*args, **kwargs):
        _require_live(token, name)
        if name in _TAKES_LOGITS:
            logits = args[0].detach().cpu().double().numpy() if isinstance(args[0], torch.Tensor) else args[0]
            args = (np.asarray(logits, dtype=np.float64),) + args[1:]
        return fn(*args, **kwargs)

    course_part.__name__ = course_part.__qualname__ = name
    course_part.__doc__ = f"The course's {name}, lent to this test."
    return course_part


def _lent_class(cls, name: str, token):
    """A subclass of the copied class that only constructs while its test runs."""
    def __new__(klass, *args, **kwargs):
        _require_live(token, name)
        return object.__new__(klass)

    return type(cls)(name, (cls,), {"__new__": __new__, "__doc__": f"The course's {name}, lent to this test.",
                                    "__module__": cls.__module__})


def _course_part(name: str, token):
    if name not in COURSE_PARTS:
        raise KeyError(f"no course version of {name!r}; known parts: {', '.join(COURSE_PARTS)}")
    if COURSE_PARTS[name] is None:
        return _lent_function(course_greedy, name, token)
    original = _private_copy(*COURSE_PARTS[name])
    if inspect.isclass(original):
        return _lent_class(original, name, token)
    return _lent_function(original, name, token)


@contextlib.contextmanager
def course_parts_under(namespace: dict, *names: str):
    """While inside, ``namespace[name]`` is the course's version of each named part; the old values come back after.

    Enter it before ``reference_forbidden``:
    ``with checks.course_parts_under(globals(), "top_k_mask"), checks.reference_forbidden("sample"): ...``
    """
    token = object()
    parts = {name: _course_part(name, token) for name in names}
    missing = object()
    saved = {name: namespace.get(name, missing) for name in names}
    _live.add(token)
    namespace.update(parts)
    try:
        yield parts
    finally:
        _live.discard(token)
        for name, old in saved.items():
            if old is missing:
                namespace.pop(name, None)
            else:
                namespace[name] = old
