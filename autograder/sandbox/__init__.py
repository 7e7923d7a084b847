"""The sandbox a submission's kernel runs in while it is graded (never shipped to students).

In reading order:

* ``isolation``: which sandbox this machine allows (bubblewrap, or a refusal with the reason), and one submission's
  sandbox from before its worker starts to after it ends;
* ``bubblewrap``: the bwrap command line: what the kernel sees of the file system, the network it does not have;
* ``cgroups``: the memory cap per submission, where the machine lets the grader make a cgroup;
* ``processes``: what a submission leaves running, killed after every submission.

The limits a kernel sets on itself from inside (rlimits) are ``autograder.kernel_limits``; nothing here imports the
grading pipeline (``autograder.grade``), an import-linter contract in pyproject.toml keeps it so.
"""
