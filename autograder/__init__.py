"""The course's autograder: nbgrader 0.9 configured in code, behind ``python -m autograder``.

    python -m autograder release [LAB...] [--if-missing]   publish the student notebooks to student/
    python -m autograder grade PATH [--lab LAB]           grade a folder, a zip or one notebook
    python -m autograder feedback [LAB...]                one HTML page per student, hidden tests removed
    python -m autograder check NOTEBOOK                   a student's own run of the visible tests
    python -m autograder verify [LAB...]                  prove each lab's tests sound
    python -m autograder regress                          papermill-run every lecture and lab (FAST=True)
    python -m autograder bench                            time grading and regress against the targets
    python -m autograder publish OUT_DIR                  the student edition: released labs, no solutions or hidden data
    python -m autograder colab [--check]                  the notebooks' Colab badges and setup cells, from pyproject.toml
    python -m autograder book [OUT_DIR]                   the lectures, executed, as static HTML

Laid out by subsystem (autograder/README.md, Map); each verb hands off to one folder:

* the top level (ships to students): ``cli`` and ``check`` (a student's own run), ``course_paths`` (where things
  live), ``environment`` (Jupyter dirs, PATH, threads), ``results`` (statuses, CSV, JSON, the table),
  ``hidden_outputs`` (the hidden-output contract), ``kernel_limits`` (a grading kernel's own limits);
* inside the kernel (ship): ``notebook_checks/`` (what the labs' test cells import), ``labs/`` (one package per lab's
  harness, ``labs/shared.py`` for what several share), ``own/`` (the carry-forward of a student's parts),
  ``answer_policy/`` (what an answer cell may do), ``notebooks/`` (nbgrader's config, guarded execution, the
  assembled notebook, generate_assignment, papermill runs);
* ``grade/``: the pipeline (submissions, lab_prep, autograde, worker, sheets, verdicts, yardsticks, messages, feedback);
* ``sandbox/``: bubblewrap, cgroups, the choice of mode (isolation), leftover processes;
* ``edition/``: release, publish, colab (badges and setup cells), book;
* ``qa/``: verify, regress, bench, and ``qa/design/`` (the design parts' references and baselines);
* ``hidden/``: the hidden data. None of the last five ships.
"""
