"""Own your engine: each lab's graded parts saved as the student's module, and ``LLM`` built from all of them.

The last code cell of every lab is::

    from autograder import own
    llm = own.my_engine("labNN", globals())

``my_engine``

1. **saves** this lab's graded definitions into ``mine/labNN.py`` (``$MINIENGINE_MINE`` moves the folder): the
   cells that defined them, found through the namespace's objects, with the imports those cells need;
2. **builds** ``LLM`` from the student's lossless parts of labs 1..NN (registry.py says which names form which
   part and how it plugs in; assemble.py plugs them), each part the student's when its saved module defines it
   and it passes its lab's visible tests (parts.py; the results are cached next to the module), the course's
   otherwise, with the reason;
3. **prints a table**: part, lab, whose (yours, the course's, or none for a design part the course lacks), why;
4. **serves** the visible golden prompts through that LLM and prints how many are token-exact; where a part of
   the student's makes them differ, the course's takes its place and the table says so;
5. returns the LLM.

Under grading (``NBGRADER_EXECUTION`` set, as by nbgrader and by ``check``) it saves nothing, reads nothing of
``mine/`` and returns the course's LLM: lab N is graded on its own, so a mistake is never charged twice.
``python -m autograder check NOTEBOOK`` saves too, from the notebook's solution cells, and records the visible
tests' results it got (``record_check``).  ``my_cost_model(config)`` is Lab 03's part, the simulator's clock.
"""
from __future__ import annotations

from autograder.own.assemble import my_cost_model
from autograder.own.save import from_check as record_check

__all__ = ["my_engine", "my_cost_model", "record_check"]


def course_llm():
    """The course's engine on the target model, every part the course's."""
    from autograder.own.assemble import _target
    from miniengine import LLM

    return LLM(model=_target(), device="cpu")


def my_engine(lab, namespace: dict, serve: bool = True):
    """Save lab's graded parts, build LLM from yours of labs 1..lab, print the table, serve the golden prompts."""
    from autograder.own import registry
    from autograder.own.status import first_line

    n = registry.lab_number(lab)
    if registry.grading():
        print(f"Lab {n:02d} is graded on its own: this cell returns the course's LLM, and neither saves nor reads "
              f"your parts (mine/).")
        return course_llm()
    try:
        return _my_engine(n, namespace, serve)
    except Exception as e:  # our fault, not the student's: still give them a working engine
        print(f"autograder.own could not assemble your engine ({first_line(e)}): this is the course's LLM")
        return course_llm()


def _my_engine(n: int, namespace: dict, serve: bool):
    from autograder.own import assemble, parts, registry, report, save
    from autograder.own.status import first_line

    try:
        path, lost, wrote = save.from_kernel(n, namespace)
        shown = save.shown_path(path)
        saved = (f"saved your Lab {n:02d} cells to {shown}" if wrote else
                 f"no Lab {n:02d} cell of yours in this namespace: {shown} stays as it was")
        saved += f"; no cell found for {', '.join(lost)}" if lost else ""
    except PermissionError as e:  # a notebook outside this checkout (save.elsewhere): the whole reason, uncut
        saved = f"your Lab {n:02d} cells were {e}; the engine uses what mine/ holds"
    except Exception as e:
        saved = f"could not save your Lab {n:02d} cells ({first_line(e)}); the engine uses what mine/ holds"
    verdicts = parts.judge_up_to(n)
    llm, refused = assemble.build(verdicts, n)
    replaced, served = {}, None
    if serve:
        cases = report.golden_cases()
        served = report.serve(llm, cases)
        if not served.ok:
            llm, refused, replaced, served = _fall_back(verdicts, n, cases, refused, served)
    labs = "lab 01" if n == 1 else f"labs 01-{n:02d}"
    print(f"Your engine after Lab {n:02d}: LLM from your parts of {labs} ({saved}).")
    print(report.table(verdicts, n, refused, replaced))
    if served is not None:
        print(served.line())
    return llm


def _fall_back(verdicts, n, cases, refused, served):
    """The golden runs differed: find the student's part to blame by serving again without it, newest first, among
    those no engine test has confirmed; failing that, without all of them.  Returns (llm, refused, replaced, served)."""
    from autograder.own import assemble, report
    from autograder.own.registry import PLUGGED

    plugged = [k for k, v in verdicts.items() if v.part.kind == PLUGGED and v.yours and k not in refused
               and assemble.placement(k, n) == "in this LLM"]
    unconfirmed = [k for k in plugged if not verdicts[k].confirmed]
    what = f"the engine raised {served.error}" if served.error else (served.differ[0] if served.differ else "")
    tries = [[k] for k in reversed(unconfirmed)] + ([unconfirmed] if len(unconfirmed) > 1 else [])
    for suspects in [t for t in tries if t != plugged] + [plugged]:
        llm, refused_now = assemble.build(verdicts, n, exclude=frozenset(suspects))
        again = report.serve(llm, cases)
        if again.ok or suspects is plugged:
            blame = "with yours" if len(suspects) == 1 else "with your parts together"
            replaced = {k: f"{blame} the golden runs were not token-exact ({what}); `check` runs its lab's engine "
                           f"tests" for k in suspects}
            return llm, refused_now, replaced, again
    raise AssertionError("unreachable")
