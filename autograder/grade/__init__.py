"""``grade`` and ``feedback``: the grading pipeline, on the trusted side of the kernel (never shipped to students).

In reading order, the way one submission travels:

* ``submissions``: what ``grade PATH`` was given (a notebook, a folder, a zip) and whose each notebook is;
* ``lab_prep``: what grading knows of a lab before any submission runs (test cells, template gradebook, release);
* ``autograde``: the verb: every student in an isolated nbgrader course, in parallel, in the sandbox
  (``autograder.sandbox``);
* ``worker``: one student's autograde, in its own process;
* ``sheets``, ``verdicts`` and ``yardsticks``: what the course's solution observed (the answer sheet), the verdict on
  each test cell from what the kernel observed, and the measures whose truth never enters the kernel;
* ``messages``: what a student may read of a graded test, and the hidden outputs' verdicts (an allow-list);
* ``feedback``: one HTML page per student, from the allow-listed results.

The grades themselves (CSV, JSON, the table) are ``autograder.results``; the notebook that runs is assembled by
``autograder.notebooks.assembly``, the same as ``check`` assembles it.
"""
