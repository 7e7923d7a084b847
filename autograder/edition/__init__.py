"""What students receive (never shipped to students itself): ``release``, ``publish``, ``colab`` and ``book``.

* ``release``: nbgrader's generate_assignment (``autograder.notebooks.assignments``), then the copy into student/
  that never overwrites a notebook the student edited;
* ``publish``: the student edition, a repository students clone or open on Colab; what ships of ``autograder/`` is a
  rule of folders (``SHIPPED_PACKAGES``), checked by an import-linter contract in pyproject.toml;
* ``colab``: the notebooks' Open-in-Colab badges and setup cells, from one setting;
* ``book``: the lectures as a static course book.
"""
