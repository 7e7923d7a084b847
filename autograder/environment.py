"""The process environment that nbgrader, papermill and the kernels they start need.

Set here rather than in the Makefile alone, so ``python -m autograder`` works
when run directly, from any directory.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def prepare(workers: int = 1) -> None:
    """Call once, before nbgrader, papermill or a kernel starts.

    * Jupyter, IPython and matplotlib write their state under the environment,
      not the user's home directory (the Makefile sets the same variables).
    * The interpreter's bin/ goes first on PATH: nbgrader shells out to
      ``alembic`` (autograder/README.md, nbgrader fact 2), and kernels must be this Python.
    * Every kernel gets one math thread, even a single one: N kernels with N
      threads each on N cores run many times slower than one thread each, and
      on a shared machine a lone kernel with two threads stalled the same way
      (a forward of the tiny model took 451 ms instead of 6 ms).
    """
    home = Path(sys.prefix) / "home"
    defaults = {
        "JUPYTER_CONFIG_DIR": home / "jupyter-config",
        "JUPYTER_DATA_DIR": home / "jupyter-data",
        "JUPYTER_RUNTIME_DIR": home / "jupyter-runtime",
        "IPYTHONDIR": home / "ipython",
        "MPLCONFIGDIR": home / "matplotlib",
    }
    for name, path in defaults.items():
        os.environ.setdefault(name, str(path))
    # IPython warns ("IPython parent ... is not a writable location") when its folder is missing: make them exist,
    # as `make setup` does, for a checkout that calls python -m autograder without make (Colab, a plain venv).
    for name in ("IPYTHONDIR", "MPLCONFIGDIR"):
        try:
            Path(os.environ[name]).mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # a read-only location: IPython's warning then says so
    os.environ.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # silences a debugger warning on stderr
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + path
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = "1"
