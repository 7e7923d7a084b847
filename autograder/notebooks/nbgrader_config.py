"""The nbgrader configuration, built in code.

nbgrader reads nbgrader_config.py only from the current directory (autograder/README.md,
nbgrader fact 1): run it anywhere else and it silently makes an empty
gradebook.  So every verb passes this Config object explicitly, and
``release`` also writes course/nbgrader_config.py, which imports it, for
instructors who run nbgrader or its formgrader by hand from course/.
"""
from __future__ import annotations

from pathlib import Path

from traitlets.config import Config

from autograder import course_paths

COURSE_ID = "miniengine"


def nbgrader_config(root: Path | None = None, timeout: int = 60, kernel_manager_class=None) -> Config:
    from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
    from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, ClearHiddenTests, GetGrades,
                                        IgnorePattern, LimitOutput, SaveAutoGrades)

    from autograder.notebooks.execute import GuardedExecute, kernel_arguments

    root = Path(root or course_paths.COURSE)
    c = Config()
    c.CourseDirectory.root = str(root)
    c.CourseDirectory.course_id = COURSE_ID
    c.CourseDirectory.source_directory = str(course_paths.LABS)  # absolute: the labs stay where they are
    c.CourseDirectory.db_url = f"sqlite:///{Path(root) / 'gradebook.db'}"
    c.Exchange.root = str(Path(root) / "exchange")  # unused without JupyterHub, but never /srv/nbgrader
    # Timeouts are per cell (fact 6); a hanging cell is interrupted and the next one runs.
    c.Execute.timeout = int(timeout)
    c.Execute.interrupt_on_timeout = True
    c.Execute.extra_arguments = kernel_arguments()
    if kernel_manager_class is not None:  # grading: the kernel starts inside the student's sandbox
        c.GuardedExecute.kernel_manager_class = kernel_manager_class
    # nbgrader's autograde list, with Execute swapped for the version that survives a dead kernel.
    c.Autograde.autograde_preprocessors = [GuardedExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
                                           SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
    # Feedback shows hidden tests unless told not to (fact 5).  `python -m autograder feedback` does not use
    # nbgrader's feedback at all (autograder/grade/feedback.py builds pages from an allow-list); this is for an
    # instructor who runs nbgrader's own generate_feedback by hand.
    c.GenerateFeedback.preprocessors = [GetGrades, CSSHTMLHeaderPreprocessor, ClearHiddenTests]
    return c


CONFIG_FILE = '''\
# Written by `python -m autograder release`. nbgrader reads this file only from the current directory,
# so run nbgrader (or `jupyter lab` with the formgrader) from this folder. The settings live in autograder/notebooks/nbgrader_config.py.
import os

from autograder.notebooks.nbgrader_config import nbgrader_config

c = get_config()  # noqa: F821 (provided by nbgrader)
c.merge(nbgrader_config(root=os.path.dirname(os.path.abspath(__file__))))
'''


def write_config_file(root: Path | None = None) -> Path:
    path = Path(root or course_paths.COURSE) / "nbgrader_config.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != CONFIG_FILE:
        path.write_text(CONFIG_FILE)
    return path


def alembic_head_in_process() -> None:
    """nbgrader stamps every gradebook it creates with the head of its own database migrations, which it learns by
    running `alembic heads` in a process of its own: 4.2 s of CPU, paid by every verb that makes a gradebook
    (release, grade, verify, publish).  alembic's Python API reads the same migration scripts in 3 ms, and gives
    the same answer (tests/autograder/test_grading.py compares the two)."""
    import nbgrader.api
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import ALEMBIC_DIR

    def get_alembic_version() -> str:
        return ScriptDirectory(ALEMBIC_DIR).get_current_head()

    nbgrader.api.get_alembic_version = get_alembic_version


def nbgrader_api(root: Path | None = None, timeout: int = 60, kernel_manager_class=None):
    """nbgrader's Python API on the course at ``root``; each call returns {success, log, error}."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    alembic_head_in_process()

    root = Path(root or course_paths.COURSE)
    config = nbgrader_config(root, timeout, kernel_manager_class)
    Path(root).mkdir(parents=True, exist_ok=True)
    return NbGraderAPI(CourseDirectory(config=config), config=config)


def succeeded(result: dict, what: str) -> None:
    """Raise with nbgrader's own log when an API call failed: its messages are the useful ones."""
    if not result.get("success"):
        detail = (result.get("error") or result.get("log") or "").strip()
        raise RuntimeError(f"{what} failed:\n{detail[-3000:]}")
