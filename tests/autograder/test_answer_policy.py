"""The answer policy (autograder/answer_policy/): every answer in the course passes it, and code that reaches the
notebook's or the interpreter's machinery, the tests' names or the answer key does not, in plain or obfuscated form.

Each refusal names the cell, the line and the construct, so a student can find and fix it.
"""
from __future__ import annotations

import nbformat
import pytest

from autograder import answer_policy as policy
from miniengine.paths import REPO_ROOT

LABS = sorted((REPO_ROOT / "labs").glob("*/*.ipynb"))


def answers_of(nb) -> dict[str, str]:
    return {c.metadata.nbgrader["grade_id"]: c.source for c in nb.cells
            if c.cell_type == "code" and c.get("metadata", {}).get("nbgrader", {}).get("solution")}


@pytest.fixture(scope="module")
def lab01():
    return policy.lab_of(nbformat.read(REPO_ROOT / "labs" / "lab01_naive_decode" / "lab01_naive_decode.ipynb", 4))


def refused(source: str, lab) -> list[tuple[int, str]]:
    return [(r.line, r.construct) for r in policy.check_answers({"greedy": source}, lab)]


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.parent.name)
def test_every_answer_of_the_course_passes(path):
    nb = nbformat.read(path, as_version=4)
    assert policy.check_answers(answers_of(nb), policy.lab_of(nb)) == []


ATTACKS = {  # what a hostile answer cell tries -> the construct the refusal names
    "an input transformer (the five-line attack)": ("_ip = get_ipython()\n_ip.input_transformers_post.append(f)\n",
                                                    "get_ipython"),
    "the shell by another name": ("shell = (lambda: get_ipython)()()\n", "get_ipython"),
    "a magic": ("%load_ext autoreload\n", "an IPython magic or shell command (% or !)"),
    "a shell escape": ("!cat /etc/passwd\n", "an IPython magic or shell command (% or !)"),
    "an event hook through display": ("display({'application/x': 1}, raw=True)\n", "display"),
    "exec of copied source": ("exec(src)\n", "exec"),
    "eval hidden in a lambda": ("f = lambda s: (eval)(s)\n", "eval"),
    "compile": ("code = compile('1', 'x', 'eval')\n", "compile"),
    "__import__ in a comprehension": ("m = [__import__('sys') for _ in range(1)]\n", "__import__"),
    "the debugger": ("breakpoint()\n", "breakpoint"),
    "import sys": ("import sys\n", "import sys"),
    "from importlib import reload": ("from importlib import reload\n", "from importlib import reload"),
    "import inspect": ("import inspect as i\n", "import inspect"),
    "import gc": ("import gc\n", "import gc"),
    "import ctypes": ("import ctypes\n", "import ctypes"),
    "import builtins": ("import builtins\n", "import builtins"),
    "import the grader": ("from autograder.labs import lab01\n", "from autograder.labs import lab01"),
    "a relative import": ("from . import x\n", "from . import x"),
    "threads": ("import threading\n", "import threading"),
    "pickle": ("import pickle\n", "import pickle"),
    "sys through torch": ("torch.sys.modules.clear()\n", ".sys"),
    "os through numpy's neighbours": ("np.os.system('x')\n", ".os"),
    "C++ through torch": ("torch.utils.cpp_extension.load_inline('x', '')\n", ".cpp_extension"),
    "the Colab cell's sys": ("def f():\n    return sys.modules\n", "sys"),
    "a given cell's os": ("x = os.environ\n", "os"),
    "getattr with a computed name": ("f = getattr(torch, 's' + 'ys')\n", "getattr"),
    "getattr as a value": ("g = getattr\n", "getattr"),
    "getattr on a dunder": ("f = getattr(greedy, '__globals__')\n", "getattr(..., '__globals__')"),
    "a function's globals": ("def f():\n    pass\nx = f.__globals__\n", ".__globals__"),
    "a function's code": ("def f():\n    pass\nf.__code__ = None\n", ".__code__"),
    "the builtins dict": ("x = __builtins__\n", "__builtins__"),
    "subclasses": ("x = ().__class__.__base__.__subclasses__()\n", ".__subclasses__"),
    "a generator's frame": ("def g():\n    yield 1\nx = g().gi_frame.f_back.f_globals\n", ".f_back"),
    "a traceback's frame": ("def f(e):\n    return e.__traceback__.tb_frame\n", ".__traceback__"),
    "globals()": ("globals()['lab'] = None\n", "globals"),
    "vars()": ("v = vars()\n", "vars"),
    "the harness": ("def greedy(x):\n    return lab.checks\n", "lab"),
    "the hidden report": ("def greedy(x):\n    report.rows.clear()\n", "report"),
    "importlib by its test-cell name": ("importlib.reload = None\n", "importlib"),
    "a wrapped model's inside": ("def beam(model):\n    return model._model(1)\n", "._model"),
    "a private attribute by getattr": ("def beam(model):\n    return getattr(model, '_model')\n",
                                       "getattr(..., '_model')"),
    "shadowing a built-in the tests use": ("print = lambda *a: None\n", "print"),
    "shadowing isinstance": ("def isinstance(a, b):\n    return True\n", "isinstance"),
    "redefining a given function": ("def load_model(*a):\n    return None\n", "load_model"),
    "re-importing a given name from elsewhere": ("import torch as np\n", "np"),
    "the answer key": ("from miniengine.sampling import top_k_mask\n", "from miniengine.sampling import top_k_mask"),
    "the reference decoder": ("from miniengine.reference import naive_generate\n",
                              "from miniengine.reference import naive_generate"),
    "a format string reading globals": ("s = '{0.__globals__}'.format(greedy)\n",
                                        "a format string that reads a private or dunder attribute"),
    "torch's dispatch": ("class T:\n    def __torch_function__(self, *a):\n        pass\n", "def __torch_function__"),
    "a finaliser": ("class T:\n    def __del__(self):\n        pass\n", "def __del__"),
    "a star import": ("from math import *\n", "from math import *"),
    # A private name the answer gives its own object does not open other objects' insides to writes: lab 05's
    # `session._peak = 0` scored 45/45 while the harness read the session's own peak (fixed there too).
    "a course object's private counter, named like the answer's own": (
        "class A:\n    def __init__(self):\n        self._peak = 1\ndef f(session):\n    session._peak = 0\n",
        "._peak = ..."),
    "setattr on another object, named like the answer's own": (
        "class A:\n    def __init__(self):\n        self._peak = 1\ndef f(session):\n    setattr(session, '_peak', 0)\n",
        "setattr(..., '_peak')"),
    "a private attribute deleted on another object": (
        "class A:\n    def __init__(self):\n        self._x = 1\ndef f(o):\n    del o._x\n", "del ._x"),
    "a method's other parameter": (
        "class A:\n    def __init__(self):\n        self._x = 1\n    def f(self, o):\n        o._x = 2\n", "._x = ..."),
    "a static method's parameter": (
        "class A:\n    @staticmethod\n    def f(o):\n        o._x = 2\n", "._x = ..."),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_a_hostile_answer_is_refused(name, lab01):
    source, construct = ATTACKS[name]
    assert construct in [c for _, c in refused(source, lab01)], refused(source, lab01)


ALLOWED = {  # what honest answers write, which must pass
    "its own private attributes": "class A:\n    def __init__(self):\n        self._x = 1\n    def f(self, o):\n"
                                  "        return o._x + self._x\n",
    "its own private attributes set in a function nested in a method": (
        "class A:\n    def __init__(self):\n        def g():\n            self._x = 1\n        g()\n"),
    "getattr with a plain literal name": "def f(params):\n    return getattr(params, 'top_k', 0)\n",
    "a given module imported again the same way": "import numpy as np\nimport torch\n",
    "Python's own tools": "import math\nfrom collections import deque\nimport heapq\nfrom functools import lru_cache\n",
    "locals named like test-cell names": "def greedy(logits):\n    probs = logits\n    cases = [probs]\n    return cases\n",
    "super().__init__ and __name__": "class B(dict):\n    def __init__(self):\n        super().__init__()\n"
                                     "        self.name = type(self).__name__\n",
    "a plain variable the given cells also use": "n = 3\n",
    "a name a test cell binds, bound by the answer itself": "H100 = {'peak_flops': 1}\n",
    "its own graded function used later": "def greedy(x):\n    return 0\ndef sample(x):\n    return greedy(x)\n",
}


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_an_honest_answer_passes(name, lab01):
    assert refused(ALLOWED[name], lab01) == []


def test_a_refusal_names_the_cell_the_line_and_the_construct(lab01):
    (r,) = policy.check_answers({"sample": "x = 1\n\ny = get_ipython()\n"}, lab01)
    assert (r.cell, r.line, r.construct) == ("sample", 3, "get_ipython")
    assert str(r).startswith("answer cell sample, line 3: get_ipython: ") and "may not" in str(r)


def test_a_cell_with_a_syntax_error_is_left_to_fail_on_its_own(lab01):
    assert policy.check_answers({"greedy": "def f(:\n"}, lab01) == []


def test_the_answer_keys_are_every_lab_harness_s():
    """Read from the harnesses' answer-key dicts (tests/autograder/test_answer_keys.py resolves each), not a list kept here."""
    keys = policy.answer_keys()
    assert ("miniengine.reference", "naive_generate") in keys  # the shared guard's
    assert {m for m, _ in keys} >= {"miniengine.cost.roofline", "miniengine.engine.policy"}  # labs 03 and 04's


def test_a_class_whose_method_is_an_answer_key_cannot_be_imported():
    lab = policy.lab_of(nbformat.read(REPO_ROOT / "labs" / "lab03_roofline" / "lab03_roofline.ipynb", as_version=4))
    (r,) = policy.check_answers({"forward_flops": "from miniengine.cost.roofline import CostModel\n"}, lab)
    assert "answer key" in r.why
