"""The reference guard: while a test runs, the course's answer key raises when a submission calls it.

``reference_forbidden`` swaps the code of every named function (so aliases and renamed imports are caught too);
``require_own`` insists that a graded function was written in the notebook.  An answer-key name that names
nothing raises :class:`AnswerKeyError` instead of being skipped, so a move or a rename cannot disarm the guard.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect

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
