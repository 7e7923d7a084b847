"""``python -m miniengine ...``: the course's command line, which lives in :mod:`miniengine.course.cli`.

The one module of the engine's folder that imports ``miniengine.course`` (pyproject.toml's import-linter
contract names this exception): the verbs are course tooling, and the engine itself never needs them.
"""
import sys

from miniengine.course.cli import main

if __name__ == "__main__":
    sys.exit(main())
