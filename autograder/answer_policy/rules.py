"""The answer policy's rules: what an answer cell may not name, import or reach, each with the reason a student reads.

autograder/answer_policy/__init__.py says why there is a policy and what it covers.
"""
from __future__ import annotations

import builtins
import dataclasses
import re

# Modules an answer may import whatever the lab's given cells import: Python's own numeric and container tools.
STANDARD = {"math", "cmath", "numpy", "torch", "collections", "itertools", "functools", "dataclasses", "typing",
            "heapq", "bisect", "random", "hashlib", "statistics", "fractions", "decimal", "enum", "abc", "copy", "string",
            "re", "time", "json", "contextlib", "textwrap", "array", "numbers", "pprint"}
# The interpreter's and the notebook's machinery, threads, processes, code loading, and the grader: never, by any
# road (an import, a given cell's name, an attribute of another module such as torch.sys).
MACHINERY = {"sys", "os", "importlib", "inspect", "gc", "ctypes", "builtins", "IPython", "ipykernel",
             "code", "codeop", "pickle", "cPickle", "marshal", "shelve", "dill", "threading", "_thread",
             "multiprocessing", "concurrent", "subprocess", "signal", "atexit", "traceback", "faulthandler",
             "tracemalloc", "pdb", "bdb", "runpy", "site", "sysconfig", "operator", "weakref", "asyncio", "socket",
             "autograder", "nbgrader", "nbclient", "jupyter_client", "zmq", "cffi", "pathlib", "shutil", "io",
             "tempfile", "glob", "linecache", "tokenize", "dis", "ast", "symtable", "platform", "resource", "mmap"}
# Attribute names that open a door to that machinery from an allowed module (torch.sys, torch.os, numpy.ctypeslib,
# torch.utils.cpp_extension, torch.package's pickles, torch.hub's downloads).
DOORS = {"sys", "os", "importlib", "inspect", "gc", "ctypes", "builtins", "subprocess", "pickle", "marshal",
         "threading", "multiprocessing", "signal", "atexit", "traceback", "autograder", "IPython", "ctypeslib",
         "cpp_extension", "load_inline", "package", "hub"}
FORBIDDEN_CALLS = {
    "get_ipython": "IPython's shell decides how every later cell runs",
    "display": "IPython's display is the channel the tests report through",
    "exec": "it runs code made from text", "eval": "it runs code made from text",
    "compile": "it makes code from text", "__import__": "it imports by a computed name",
    "breakpoint": "the debugger can trace every later cell",
    "globals": "it hands out the notebook's namespace as a dict", "locals": "it hands out a namespace as a dict",
    "vars": "it hands out a namespace as a dict",
}
ATTRIBUTE_BUILTINS = {"getattr", "setattr", "delattr", "hasattr"}
PLAIN_DUNDERS = {"__init__", "__name__", "__qualname__", "__class__", "__doc__", "__len__", "__iter__", "__next__",
                 "__getitem__", "__setitem__", "__contains__", "__repr__", "__str__", "__call__", "__enter__",
                 "__exit__", "__post_init__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__",
                 "__bool__"}
FRAME_ATTRIBUTES = {"gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code", "f_back", "f_globals",
                    "f_locals", "f_builtins", "f_code", "f_trace", "tb_frame", "tb_next", "co_code", "co_consts"}
# Dunder methods that let an object take over what the harness does with it (torch's and NumPy's dispatch).
TAKEOVER_METHODS = {"__torch_function__", "__torch_dispatch__", "__array_function__", "__array_ufunc__",
                    "__getattribute__", "__init_subclass__", "__set_name__", "__class_getitem__", "__reduce__",
                    "__reduce_ex__", "__del__"}
FORMAT_DUNDER = re.compile(r"\{[^{}]*\.(_\w*|\w*__\w*)[^{}]*\}")  # "{0.__globals__}".format(f)
BUILTIN_NAMES = {n for n in dir(builtins) if not n.startswith("_")}
# The harness's names in the test cells, refused even where a template does not show the cell that binds them (a
# release's hidden cells are empty).
HARNESS_NAMES = {"lab", "report", "autograder", "importlib", "own", "checks"}


@dataclasses.dataclass(frozen=True)
class Refusal:
    """One rule an answer cell broke: which cell, which line (of the cell), what, and why in plain words."""

    cell: str
    line: int
    construct: str
    why: str

    def __str__(self) -> str:
        return f"answer cell {self.cell}, line {self.line}: {self.construct}: {self.why}"
