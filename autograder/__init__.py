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

Modules, one concept each, by subsystem:

* the sandbox: ``bubblewrap`` (the sandbox itself), ``cgroups`` (memory caps), ``isolation`` (the choice of mode),
  ``processes`` (leftovers), ``sandbox`` and ``execute`` (the kernel's in-process limits, guarded execution);
* the grading pipeline: ``submissions`` (what a grade PATH contains), ``assembly`` (the lab's release with the
  submission's answers), ``answer_policy/`` (what an answer cell may do), ``lab_prep`` (hidden inputs),
  ``grading`` and ``worker`` (one isolated nbgrader course per student), ``sheets``, ``verdicts`` and ``judges``
  (verdicts outside the kernel), ``hidden_outputs`` and ``messages`` (hidden outputs and what a message may say),
  ``results`` (statuses, CSV, JSON, the table), ``feedback``;
* the student edition: ``release``, ``publish``, ``colab`` (badges and setup cells), ``book``;
* course QA: ``verify``, ``regress``, ``bench``, ``design/`` (the design parts' references and baselines, never
  published);
* plumbing: ``cli``, ``layout`` (where things live), ``environment`` (Jupyter dirs, PATH, threads), ``config``
  (the nbgrader configuration), ``check`` (a student's own run);
* inside the kernel: ``notebook_checks`` and ``checks/`` (what the labs' test cells import), ``labs/`` (each lab's
  harness), ``own/`` (the carry-forward of a student's parts); ``hidden/`` holds the hidden data.
"""
