"""Setup files stay consistent: environment.yml mirrors pyproject, the README gives the two commands."""
import tomllib

import pytest
import yaml

from miniengine.paths import REPO_ROOT

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


def test_environment_yml_matches_pyproject():
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(pyproject["dependencies"])
    for extra in pyproject["optional-dependencies"].values():
        wanted |= set(extra)
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    pip_deps = {d for d in pip_section if not d.startswith("-e")}
    assert pip_deps == wanted, f"only in environment.yml: {pip_deps - wanted}; only in pyproject: {wanted - pip_deps}"


def test_torch_is_loose_in_pyproject_and_pinned_in_constraints():
    deps = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.startswith("torch>=") for d in deps)
    assert "torch==2.13.0" in (REPO_ROOT / "constraints.txt").read_text().splitlines()


def test_readme_starts_with_the_two_commands():
    head = (REPO_ROOT / "README.md").read_text()[:1500]
    assert "make lab" in head and "make test" in head


def test_ci_calls_make_test():
    assert "make test" in (REPO_ROOT / ".ci" / "run").read_text()
