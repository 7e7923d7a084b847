"""Running notebooks, for every verb that does: grading, ``check``, ``verify``, ``release``, ``regress``, ``book``.

* ``nbgrader_config``: nbgrader's configuration, built in code;
* ``execute``: nbgrader's Execute preprocessor, made to survive a kernel that dies or stops making sense;
* ``assembly``: the notebook that is graded, the course's release with the student's answer cells in it;
* ``assignments``: nbgrader's generate_assignment, run only when a lab's source changed;
* ``papermill_runs``: one notebook executed top to bottom with papermill, FAST=True (``regress`` and ``book``).

Shipped to students: ``check`` assembles and runs a notebook exactly as grading does.
"""
