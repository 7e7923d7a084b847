"""Helpers shared by the autograder's end-to-end tests (no tests here): run the CLI as a user would, in folders of its own."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "autograder" / "fixtures" / "lab01"


def notebook_cell(notebook: Path, grade_id: str) -> str:
    """The source of the cell of ``notebook`` whose nbgrader grade_id is ``grade_id``."""
    return next("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"]
                if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)


def isolated_env(work: Path) -> dict:
    """The autograder's working folders under ``work``, so tests never touch the real course/ or student/."""
    env = dict(os.environ)
    env.update(AUTOGRADER_COURSE_DIR=str(work / "course"), AUTOGRADER_STUDENT_DIR=str(work / "student"),
               AUTOGRADER_BUILD_DIR=str(work / "build"), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def run_cli(*args, env: dict, cwd: Path, timeout: int = 600, **as_user) -> subprocess.CompletedProcess:
    """``as_user``: subprocess's user, group and extra_groups (normal_user gives them)."""
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, **as_user)


def explain(r: subprocess.CompletedProcess) -> str:
    return f"exit {r.returncode}\n--- stdout\n{r.stdout[-6000:]}\n--- stderr\n{r.stderr[-4000:]}"


@contextlib.contextmanager
def normal_user():
    """A folder and the subprocess arguments to run the grader in it as a normal user, not root (issue 24).

    Not root already: yourself, in a fresh folder. Root: a throwaway account made here, given traverse (o+x, never
    read) on the folders above the interpreter that lack it (here /root, where pyenv lives) and a folder of its
    own; the account, the modes and the folder are restored or removed afterwards, whatever happens.
    """
    import pwd
    import shutil
    import stat
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="autograder-user-"))
    if os.geteuid() != 0:
        try:
            yield work, {}
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    name = f"agtest{os.getpid()}"
    opened: list[tuple[Path, int]] = []
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                   capture_output=True)
    try:
        account = pwd.getpwnam(name)
        os.chown(work, account.pw_uid, account.pw_gid)
        for path in {Path(os.path.realpath(sys.executable)), Path(os.path.realpath(sys.prefix)), REPO}:
            for folder in reversed(path.parents):
                mode = folder.stat().st_mode
                if not mode & stat.S_IXOTH and folder not in {f for f, _ in opened}:
                    opened.append((folder, stat.S_IMODE(mode)))
                    folder.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
        yield work, {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
    finally:
        for folder, mode in reversed(opened):
            folder.chmod(mode)
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run(["userdel", name], capture_output=True)


def user_env(work: Path) -> dict:
    """isolated_env for a normal user: also HOME and the folders Jupyter, IPython and matplotlib write, in ``work``
    (the Makefile points them into the venv, which only its owner may write)."""
    env = isolated_env(work)
    env.update(HOME=str(work), IPYTHONDIR=str(work / "ipython"), MPLCONFIGDIR=str(work / "matplotlib"),
               JUPYTER_RUNTIME_DIR=str(work / "jupyter-runtime"), TMPDIR="/tmp")
    return env
