"""What the code in a lab's answer cells may do, checked from its syntax tree before any kernel starts.

A submission's answer cells run in the same kernel as the tests, before them.  Code there that reaches the
notebook's or the interpreter's machinery can change how the later test cells run (an IPython input transformer
that blanks them, a hook that reads them, a patched ``sys.modules``), read what they hold, or copy the course's
answer key by its source.  So the trusted side reads every answer cell first (autograder/README.md, Trust model),
and an answer cell that does any of the following is refused: it is not run, the lab's stub runs in its place, and
the refusal names the cell, the line and the construct.

  * no IPython: ``get_ipython``, ``display``, magics (``%...``) and shell escapes (``!...``);
  * no code from text: ``exec``, ``eval``, ``compile``, ``__import__``, ``breakpoint``;
  * no namespaces as dicts: ``globals``, ``locals``, ``vars``; ``getattr``/``setattr``/``delattr``/``hasattr``
    only with a literal attribute name, so that the rules below see it;
  * no dunder attributes (``__globals__``, ``__code__``, ``__subclasses__``...), except a few that are plain
    Python (``__init__``, ``__name__``...); no frame or traceback attributes (``gi_frame``, ``f_back``...);
  * no private attribute (``x._name``) that the answer cells do not themselves define: the course's objects keep
    their insides to themselves (a wrapped model's ``_model``, which the harness counts around); and one is set
    or deleted (``x._name = ...``, ``setattr(x, "_name", ...)``) only on the answer's own object, ``self`` in a
    method of a class it defines, whatever names it gives its own (``session._peak = 0`` is refused);
  * imports only from what the lab needs: Python's numeric and container modules, and the modules and names the
    lab's given cells import; never an answer-key function (the names the harnesses forbid), and never the
    interpreter's machinery (``sys``, ``os``, ``importlib``, ``inspect``, ``gc``, ``ctypes``, ``builtins``,
    ``IPython``, ``pickle``, threads and processes) nor the grader (``autograder``), not even as an attribute
    of another module (``torch.sys``);
  * no name that belongs to the tests (``lab``, ``report``: bound only by test cells) and none of the given
    cells' modules that are machinery (the Colab cell's ``sys``); no module-level rebinding of a name the given
    cells define, or of a Python built-in (``print``, ``float``, ``isinstance``), which the test cells use.

Every answer in the course passes (tests/autograder/test_answer_policy.py); the rules are about reach, not style.

``rules`` holds the rules, ``context`` reads what a lab's own cells define, ``checker`` reads the answers.
"""
from __future__ import annotations

from autograder.answer_policy.checker import check_answers, own_private_names
from autograder.answer_policy.context import Lab, answer_keys, lab_of, parse
from autograder.answer_policy.rules import HARNESS_NAMES, Refusal

__all__ = ["HARNESS_NAMES", "Lab", "Refusal", "answer_keys", "check_answers", "lab_of", "own_private_names", "parse"]
