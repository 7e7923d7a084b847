"""Where the course's data lives, wherever a notebook runs from.

Notebooks run from lectures/, labs/labNN/, student/labNN/ and nbgrader's
course/autograded/<student>/labNN/; all of them find the shipped models and
golden files through these paths rather than through relative ones.
"""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA = REPO_ROOT / "data"
MODELS = DATA / "models"
TARGET = MODELS / "target"
DRAFT = MODELS / "draft"
GOLDEN = DATA / "golden"


def resolve_model_dir(model: str | Path) -> Path:
    """A model directory as given, else relative to the repository root, else a shipped model's name."""
    for candidate in (Path(model), REPO_ROOT / model, MODELS / str(model)):
        if (candidate / "config.json").exists():
            return candidate
    raise FileNotFoundError(
        f"model={str(model)!r}: no config.json there, under {REPO_ROOT}, or among the shipped models "
        f"({', '.join(sorted(p.name for p in MODELS.iterdir() if p.is_dir())) if MODELS.exists() else 'none'})"
    )
