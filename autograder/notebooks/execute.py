"""nbgrader's Execute preprocessor, made to survive a kernel that dies or stops making sense.

nbgrader's own Execute lets a DeadKernelError escape (after ``os.kill``, a
segfault, the OOM killer), and so does any error in the kernel protocol (a
notebook that monkeypatches ``json.loads`` garbles the kernel's replies):
autograde then deletes the student's autograded notebook and keeps no grades
at all.  Here the cell that broke the kernel gets an error output saying so,
every later code cell gets a "not run" error, and grading goes on: test cells
that ran keep their result, the rest score zero with a clear reason.
"""
from __future__ import annotations

import sys


def skip_iri_grammar() -> None:
    """Keep jsonschema from building the rfc3987-syntax grammar, which nothing here uses; call before nbformat.

    nbformat imports jsonschema, and jsonschema imports rfc3987-syntax (when installed: Jupyter pulls it in) for
    one format check, "iri", which builds some 35 Lark parsers at import: 1.8 s of CPU in every process, once
    per graded notebook here (jsonschema issue 1428). A notebook's schema (draft 4) has no "iri" field, so the
    import is refused and jsonschema goes on without that one check.
    """
    sys.modules.setdefault("rfc3987_syntax", None)  # a None entry makes the import raise ImportError


skip_iri_grammar()  # before nbformat's first import, just below: grade, verify and the worker import this module first

from nbclient.exceptions import DeadKernelError  # noqa: E402
from nbformat.notebooknode import NotebookNode  # noqa: E402
from nbgrader.preprocessors import Execute  # noqa: E402

KERNEL_DIED = "DeadKernelError"
NOT_RUN = "NotRunError"
TIMEOUT = "CellTimeoutError"  # the ename nbgrader's Execute gives a cell that ran past Execute.timeout


def kernel_arguments() -> list[str]:
    """Extra arguments for every grading kernel: import the sandbox before the first cell."""
    return ["--IPKernelApp.exec_lines=import autograder.kernel_limits",
            "--IPKernelApp.log_level=ERROR"]  # its TCP warning on stderr is noise to a student running check


def error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class GuardedExecute(Execute):
    def preprocess(self, nb, resources=None, km=None):
        self._dead_at = None
        self._ran: set[int] = set()
        try:
            return super().preprocess(nb, resources, km)
        except Exception as e:  # the kernel broke while starting or shutting down: keep what ran
            if getattr(self, "nb", None) is None:
                raise
            # A cell that never ran must not look like a test that passed (no error output = full points).
            reason = f"not run: the grading kernel failed ({type(e).__name__}: {str(e)[:200]})"
            for index, cell in enumerate(self.nb.cells):
                if cell.cell_type == "code" and index not in self._ran:
                    cell.outputs = [error_output(NOT_RUN, reason)]
            return self.nb, self.resources

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        self._ran.add(index)
        if self._dead_at is not None:
            cell.outputs = [error_output(NOT_RUN, f"not run: the kernel broke down in cell {self._dead_at} and was not restarted")]
            return cell, resources
        sandbox = getattr(self.kernel_manager_class, "sandbox", None)
        if sandbox is not None and len(self._ran) == 1:  # the kernel is up and has made its sockets
            sandbox.close_runtime()
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        hidden = sandbox is not None and grade_id in sandbox.hidden_cells and "BEGIN HIDDEN TESTS" in cell.source
        try:
            if hidden:  # the hidden prompts exist in the sandbox only while a hidden test cell runs
                sandbox.show_hidden_inputs(True)
            return super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            reason = "the kernel died while running this cell (os.kill, a crash, or running out of memory)"
        except Exception as e:  # with allow_errors, only a broken kernel connection gets here
            reason = f"the kernel stopped answering properly while running this cell ({type(e).__name__}: {e})"
        finally:
            if hidden:
                sandbox.show_hidden_inputs(False)
        self._dead_at = index
        cell.outputs.append(error_output(KERNEL_DIED, reason))
        return cell, resources
