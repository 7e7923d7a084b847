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

Modules, one concept each: ``layout`` (where things live), ``environment`` (Jupyter dirs, PATH, threads),
``config`` (the nbgrader configuration), ``sandbox`` and ``execute`` (the grading kernel's limits),
``release``, ``submissions`` (what a grade PATH contains), ``grading`` and ``worker`` (one isolated
nbgrader course per student), ``results`` (statuses, CSV, JSON, the table), ``feedback``, ``check``,
``verify``, ``regress``, ``bench``, ``publish`` (the student edition), ``colab`` (badges and setup cells),
``book``, ``cli``.  ``notebook_checks`` is imported by the labs' test cells.
"""
