"""The command line's verbs whose engine parts live outside course tooling: each module here is one verb's flags,
checks and printed report, on top of the engine module that does the work.

* :mod:`.roofline`: ``python -m miniengine roofline``, on :mod:`miniengine.cost.roofline`;
* :mod:`.simulate`: ``python -m miniengine simulate``, the policy comparison on :mod:`miniengine.serving.simulator`;
* :mod:`.disagg`: ``python -m miniengine disagg``, on :mod:`miniengine.serving.disagg`.

:mod:`miniengine.course.cli` wires them in.
"""
