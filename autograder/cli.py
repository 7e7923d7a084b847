"""Command line: python -m autograder {release,grade,feedback,check,verify,regress,bench,publish,colab,book} ...

Works from any directory: paths are resolved against the repository, the
nbgrader configuration is built in code, and the environment (Jupyter folders,
PATH for alembic) is prepared before nbgrader starts.  Bad arguments and
unknown labs exit with status 2 and one line on stderr.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from autograder import course_paths


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise SystemExit(_fail(f"{self.prog}: error: {message} (see --help)"))


def _fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 2


def _positive(kind, allow_zero=False):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < 0 or (value == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(f"must be {'at least 0' if allow_zero else 'greater than 0'}, got {text!r}")
        return value
    return parse


def cmd_release(args) -> int:
    from autograder import environment
    from autograder.edition import release

    environment.prepare()
    return release.release(args.labs, if_missing=args.if_missing, force=args.force)


def cmd_grade(args) -> int:
    import nbformat

    from autograder import results
    from autograder.grade import autograde

    graded = autograde.grade(Path(args.path), lab=args.lab, workers=args.workers, timeout=args.timeout,
                           memory_gb=args.memory_gb, time_limit=args.notebook_timeout, student=args.student,
                           keep=args.keep, sandbox=not args.unsafe_no_sandbox, as_submitted=args.as_submitted,
                           mine=Path(args.mine) if args.mine else None)
    labs = sorted({r.lab for r in graded})
    out = Path(args.out) if args.out else course_paths.COURSE / "grades" / (labs[0] if len(labs) == 1 else "all")
    csv_path, json_path, kept = results.write_reports(graded, out)
    results.log_run(out, graded)
    print()
    print(results.table(graded, details=not args.brief))
    for lab in labs:
        manual = results.answer_cells(nbformat.read(course_paths.Lab(lab).source, as_version=4))
        if manual:
            print(f"\n{lab}: the scores above are the autograded part; {len(manual)} answers for a TA carry "
                  f"{sum(p for _, p in manual):g} more points ({', '.join(g for g, _ in manual)}): grade them in "
                  f"nbgrader's formgrader, where each shows its model answer and rubric")
    print(f"\nwrote {csv_path} and {json_path}"
          + (f" (merged: {kept} student(s) graded earlier keep their latest grade)" if kept else ""))
    return 0


def cmd_feedback(args) -> int:
    from autograder.grade import feedback

    return feedback.feedback(args.labs, students=args.student)


def cmd_check(args) -> int:
    from autograder import check

    notebook = Path(args.notebook)
    if not notebook.suffix and not notebook.exists():  # a lab's name: lab01, or lab01_naive_decode
        notebook = course_paths.student_notebook(args.notebook)
    return check.check(notebook, timeout=args.timeout)


def cmd_verify(args) -> int:
    from autograder.qa import verify

    return verify.verify(args.labs, workers=args.workers, timeout=args.timeout)


def cmd_regress(args) -> int:
    from autograder.qa import regress

    return regress.regress(args.notebooks, workers=args.workers, timeout=args.timeout, out=Path(args.out) if args.out else None,
                           device=args.device)


def cmd_bench(args) -> int:
    from autograder.qa import bench

    return bench.bench(copies=args.copies, workers=args.workers, lab=args.lab)


def cmd_publish(args) -> int:
    from autograder.edition import publish

    return publish.publish(Path(args.out), force=args.force)


def cmd_colab(args) -> int:
    from autograder.edition import colab

    return colab.sync(args.notebooks, check=args.check)


def cmd_book(args) -> int:
    from autograder.edition import book

    return book.book(Path(args.out) if args.out else None, workers=args.workers, timeout=args.timeout)


# Each instructors' verb and the folder it hands off to; the student edition has none of those folders (publish).
INSTRUCTOR_VERBS = {"release": "edition", "grade": "grade", "feedback": "grade", "verify": "qa", "regress": "qa",
                    "bench": "qa", "publish": "edition", "colab": "edition", "book": "edition"}


def _verb(sub, name: str, help: str):
    """A verb, listed in --help only where its folder is here: in the student edition, typing an instructors' verb
    still parses, and says it is not in the edition (main)."""
    here = name not in INSTRUCTOR_VERBS or (Path(__file__).parent / INSTRUCTOR_VERBS[name]).is_dir()
    return sub.add_parser(name, **({"help": help} if here else {}))


def build_parser() -> argparse.ArgumentParser:
    about = ("Check your lab as the grader runs it: python -m autograder check lab01"
             if course_paths.is_student_edition() else "Release, grade, check and regression-run the course's notebooks.")
    p = _Parser(prog="python -m autograder", description=about)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="VERB")

    r = _verb(sub, "release", "write the student notebooks to student/ (nbgrader generate_assignment)")
    r.add_argument("labs", nargs="*", metavar="LAB", help="labs to release (default: all), e.g. lab01 or lab01_naive_decode")
    r.add_argument("--if-missing", action="store_true", help="only publish labs whose student notebook does not exist yet")
    r.add_argument("--force", action="store_true", help="overwrite student notebooks even if edited")
    r.set_defaults(func=cmd_release)

    g = _verb(sub, "grade", "grade a folder of submissions, a zip of them, or one notebook")
    g.add_argument("path", metavar="PATH")
    g.add_argument("--lab", help="the lab all submissions belong to (default: from file names)")
    g.add_argument("--student", help="the student's id, when PATH is one notebook (default: from its name)")
    g.add_argument("--mine", metavar="DIR",
                   help="the student's saved parts (their mine/ folder), when PATH is one notebook: lab 10 serves "
                        "them (default: a mine/ beside the notebook; in a folder or zip, each student's mine/ is "
                        "found beside or above their notebook)")
    g.add_argument("--workers", type=_positive(int), default=1, help="notebooks graded at once (default 1)")
    g.add_argument("--timeout", type=_positive(int), default=60, help="seconds per cell (default 60)")
    g.add_argument("--notebook-timeout", type=_positive(int), default=None,
                   help="seconds per notebook (default max(120, 6 x --timeout))")
    g.add_argument("--memory-gb", type=_positive(float, allow_zero=True), default=6.0,
                   help="memory per submission: a cgroup's cap where one can be made, else address space per "
                        "process; 0 for none (default 6)")
    g.add_argument("--out", help="folder for grades.csv and grades.json (default course/grades/LAB)")
    g.add_argument("--brief", action="store_true", help="print only the summary table")
    g.add_argument("--keep", action="store_true", help="keep the per-student nbgrader courses under course/tmp/")
    g.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="run kernels without the bubblewrap sandbox (only for notebooks you trust; recorded in grades.json)")
    g.add_argument("--as-submitted", action="store_true",
                   help="run each notebook as handed in: cells the student added run, and no answer policy reads "
                        "the answers (to test the sandbox alone; never to grade students; recorded in grades.json)")
    g.set_defaults(func=cmd_grade)

    f = _verb(sub, "feedback", "write one HTML page per graded student, hidden tests removed")
    f.add_argument("labs", nargs="*", metavar="LAB")
    f.add_argument("--student", action="append", help="only this student (repeatable)")
    f.set_defaults(func=cmd_feedback)

    c = _verb(sub, "check", "run the visible tests of your notebook and print each result")
    c.add_argument("notebook", metavar="NOTEBOOK", help="your notebook's path, or a lab's name (lab01): your copy of it")
    c.add_argument("--timeout", type=_positive(int), default=120, help="seconds per cell (default 120)")
    c.set_defaults(func=cmd_check)

    v = _verb(sub, "verify", "prove each lab's tests sound: solution full marks, stub zero, hidden tests fail on the stub")
    v.add_argument("labs", nargs="*", metavar="LAB")
    v.add_argument("--workers", type=_positive(int), default=2)
    v.add_argument("--timeout", type=_positive(int), default=60)
    v.set_defaults(func=cmd_verify)

    rg = _verb(sub, "regress", "run every lecture and lab source notebook with papermill (FAST=True)")
    rg.add_argument("notebooks", nargs="*", metavar="NOTEBOOK", help="only these notebooks (default: all)")
    rg.add_argument("--workers", type=_positive(int), default=1)
    rg.add_argument("--timeout", type=_positive(int), default=300, help="seconds per cell (default 300)")
    rg.add_argument("--out", help="folder for the executed notebooks and summary (default build/regress)")
    rg.add_argument("--device", default="cpu", help="the notebooks' DEVICE parameter: cpu (default) or cuda")
    rg.set_defaults(func=cmd_regress)

    b = _verb(sub, "bench", "time one grade, a folder of copies with workers, and regress of lecture 01 + lab 01")
    b.add_argument("--copies", type=_positive(int), default=20)
    b.add_argument("--workers", type=_positive(int), default=2)
    b.add_argument("--lab", default="lab01")
    b.set_defaults(func=cmd_bench)

    pu = _verb(sub, "publish", "write the student edition (released labs, lectures, engine, no solutions or hidden data) to OUT_DIR")
    pu.add_argument("out", metavar="OUT_DIR")
    pu.add_argument("--force", action="store_true", help="replace what OUT_DIR holds (its .git is kept)")
    pu.set_defaults(func=cmd_publish)

    co = _verb(sub, "colab", "rewrite the notebooks' Colab badges and setup cells from [tool.miniengine] in pyproject.toml")
    co.add_argument("notebooks", nargs="*", metavar="NOTEBOOK", help="only these notebooks (default: every lecture and lab)")
    co.add_argument("--check", action="store_true", help="only list the notebooks that disagree; exit 1 if any")
    co.set_defaults(func=cmd_colab)

    bk = _verb(sub, "book", "render every lecture, executed (FAST=True), to static HTML with an index")
    bk.add_argument("out", nargs="?", metavar="OUT_DIR", help="default build/book")
    bk.add_argument("--workers", type=_positive(int), default=1)
    bk.add_argument("--timeout", type=_positive(int), default=300, help="seconds per cell (default 300)")
    bk.set_defaults(func=cmd_book)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except course_paths.LabError as e:
        return _fail(f"python -m autograder {args.command}: error: {e}")
    except ImportError as e:
        missing = _missing_module(e)
        if not missing:
            raise
        return _fail(f"python -m autograder {args.command}: not in the student edition ({missing} is instructors' code)")
    except KeyboardInterrupt:
        return _fail(f"python -m autograder {args.command}: interrupted")


def _missing_module(e: ImportError) -> str | None:
    """The part of autograder/ whose absence caused ``e`` (``grade/``), else None.

    The student edition (``publish``) ships the top level and the shipped packages only (``SHIPPED_PACKAGES`` in
    autograder/edition/publish.py): an instructor's verb there finds its folder missing.
    """
    if isinstance(e, ModuleNotFoundError) and (e.name or "").startswith("autograder."):
        name = e.name.split(".")[1]
    elif e.name == "autograder" and (m := re.match(r"cannot import name '(\w+)'", str(e))):
        name = m.group(1)  # `from autograder import verify` where no such module is
    else:
        return None
    here = Path(__file__).parent
    if (here / name).is_dir() or (here / f"{name}.py").exists():
        return None
    return f"autograder/{name}"
