"""One student's autograde, in its own process and its own nbgrader course.

``grading`` starts ``python -m autograder.grade.worker`` once per submission.  A
process per student means a wedged kernel or a leaking notebook can be killed
without touching the others, and its own course folder (own gradebook.db)
means several can run at once without sharing a SQLite file.

The worker is the trusted side: it runs outside the sandbox, and only the kernel
it starts (with ``--sandbox``) runs the student's code, inside it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder.grade.worker")
    p.add_argument("--root", required=True, help="the per-student nbgrader course folder")
    p.add_argument("--lab", required=True)
    p.add_argument("--student", required=True)
    p.add_argument("--timeout", type=int, required=True, help="seconds per cell")
    p.add_argument("--memory-gb", type=float, default=0, help="address-space limit of the kernel (0: none)")
    p.add_argument("--sandbox", help="autograder.sandbox.bubblewrap.Sandbox as JSON: start the kernel inside it")
    p.add_argument("--mine", help="unsandboxed: the copy of the mine/ handed in, for the kernel's $MINIENGINE_MINE")
    args = p.parse_args(argv)

    from autograder import environment
    from autograder.kernel_limits import MEMORY_ENV
    from autograder.notebooks import \
        execute  # noqa: F401  first: nbgrader, below, imports nbformat (execute.skip_iri_grammar)
    from autograder.notebooks.nbgrader_config import nbgrader_api

    environment.prepare()
    # The kernel inherits this environment (a sandbox sets its own): the submission's mine/ or none, never the
    # instructor's.
    os.environ.pop("MINIENGINE_MINE", None)
    if args.mine and not args.sandbox:
        os.environ["MINIENGINE_MINE"] = args.mine
    if args.memory_gb:
        os.environ[MEMORY_ENV] = str(args.memory_gb)  # read by autograder.kernel_limits inside the kernel
    manager = None
    if args.sandbox:
        from autograder.sandbox.bubblewrap import Sandbox, SandboxedKernelManager

        SandboxedKernelManager.sandbox = Sandbox(**json.loads(args.sandbox))
        SandboxedKernelManager.sandbox.prepare()
        manager = SandboxedKernelManager
    api = nbgrader_api(Path(args.root), timeout=args.timeout, kernel_manager_class=manager)
    result = api.autograde(args.lab, args.student, force=True, create=True)
    Path(args.root, "worker.log").write_text((result.get("log") or "") + "\n" + (result.get("error") or ""))
    json.dump({"success": bool(result.get("success")), "error": (result.get("error") or "")[-2000:]}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
