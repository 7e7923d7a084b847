"""Whose part is it: a verdict per part of labs 1..N, from the saved modules and their visible tests.

``judge_lab(lab)`` loads ``mine/labNN.py`` once, finds for each part the visible test cells that read its names
(or anything its code calls), runs the ones not yet recorded for this module (only for plugged and clock parts,
and not registry.HEAVY), records them, and returns one :class:`Verdict` per part.  A part is the student's when
its names are there and none of its visible tests failed; ``confirmed`` when every one of them passed, the
engine tests included (which only ``check`` records): the golden run decides for the others.
"""
from __future__ import annotations

import dataclasses

from autograder.own import registry, source, status
from autograder.own.registry import CLOCK, PLUGGED, Part


@dataclasses.dataclass
class Verdict:
    part: Part
    yours: bool
    why: str
    objects: dict = dataclasses.field(default_factory=dict)
    confirmed: bool = False


def _tests_of(part: Part, ns: dict, cells: list) -> list:
    names = set(source.closure(part.names, ns)) | set(part.names)
    return [c for c in cells if c.reads & names]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def judge_lab(lab: int, live: bool = True) -> list[Verdict]:
    parts = registry.parts_of(lab)
    module = status.load(lab)
    if module.ns is None:
        return [Verdict(p, False, module.error) for p in parts]
    ns, cells = module.ns, status.visible_tests(lab)
    current = {c.grade_id: c.sha for c in cells}  # a result counts only for the test cell's source it was run on
    known = {gid: r for gid, r in status.recorded(lab, module.sha).items() if current.get(gid) == r.get("cell_sha256")}
    missing = {p.key: [n for n in p.names if not source.notebook_defined(ns.get(n))] for p in parts}  # not the course's
    objects = {p.key: {n: ns[n] for n in p.names if n in ns} for p in parts}  # before any test touches ns
    heavy = registry.HEAVY.get(f"lab{lab:02d}", set())
    todo = []
    for p in parts:
        if live and not missing[p.key] and p.kind in (PLUGGED, CLOCK):
            todo += [c for c in _tests_of(p, ns, cells) if c.grade_id not in known and c.grade_id not in heavy
                     and c not in todo]
    if todo:
        ran = status.run(module, todo)
        status.record(lab, module.sha, ran, by="a last cell")
        known.update({gid: {"status": s, "message": m} for gid, (s, m, _) in ran.items()})
    return [_verdict(p, module, missing[p.key], objects[p.key], _tests_of(p, ns, cells), known) for p in parts]


def _verdict(part, module, missing, objects, tests, known) -> Verdict:
    name = module.path.name
    if missing:
        return Verdict(part, False, f"no {', '.join(missing)} in {name}")
    for c in tests:
        r = known.get(c.grade_id)
        if r and r["status"] != status.PASSED:
            message = f": {r['message']}" if r.get("message") else ""
            return Verdict(part, False, f"{c.grade_id} {r['status']}{message}", objects)
    passed = [c.grade_id for c in tests if c.grade_id in known]
    unknown = [c.grade_id for c in tests if c.grade_id not in known]
    if not tests:
        why = "no visible test reads it"
    elif not passed:
        why = f"saved; `check` runs its {_plural(len(unknown), 'visible test')}"
    else:
        why = f"{_plural(len(passed), 'visible test')} passed" + (f", {len(unknown)} more by `check`" if unknown else "")
    return Verdict(part, True, why, objects, confirmed=bool(tests) and not unknown)


def judge_up_to(lab: int, live: bool = True) -> dict:
    """``{part key: Verdict}`` for every part of labs 1..lab."""
    out = {}
    for k in range(1, lab + 1):
        for v in judge_lab(k, live):
            out[v.part.key] = v
    return out
