"""The grading sandbox (autograder/sandbox/bubblewrap.py) and the hidden-output comparison (autograder/hidden_outputs.py).

The sandbox tests run a shell inside a real sandbox, without a kernel, so they take a second or two; the
fixture run (test_fixtures.py) shows the same properties for whole notebooks.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import time

import nbformat
import pytest
from autograder_support import REPO

from autograder import course_paths, hidden_outputs
from autograder.course_paths import INSTRUCTOR_PACKAGES
from autograder.sandbox import bubblewrap, isolation, uids

HIDDEN = REPO / "autograder" / "hidden"


# ---------------------------------------------------------------- hidden_outputs

def test_public_view_keeps_inputs_and_drops_every_output():
    for name in hidden_outputs.FILES:
        data = hidden_outputs.load(name)
        view = hidden_outputs.public_view(data)
        text = json.dumps(view)
        for section in hidden_outputs.SECTIONS:
            for case, shown in zip(data.get(section, []), view.get(section, [])):
                assert shown["prompt_token_ids"] == case["prompt_token_ids"] and shown["params"] == case["params"]
                assert set(shown) <= set(hidden_outputs.INPUT_FIELDS)
        for field in ("token_ids", "completions", "chosen_logits", "tokens_processed", "min_margins", "text"):
            assert f'"{field}"' not in text, (name, field)


def _payload(lab, cell, files):
    rows = [[f, s, n, k, next(c for c in files[f][s] if c["name"] == n)[k]]
            for f, s, n, k in sorted(hidden_outputs.expected_keys(lab, cell, files))]
    return {"cell": cell, "outputs": rows}


def test_judge_passes_the_golden_outputs_and_names_a_wrong_step_without_the_answer():
    files = {"golden": hidden_outputs.load("golden")}
    lab, cell = "lab01_naive_decode", "sample-hidden"
    good = _payload(lab, cell, files)
    assert len(good["outputs"]) == 10  # two of each of the five kinds
    assert hidden_outputs.judge(lab, cell, [good], files) == (True, "")

    bad = copy.deepcopy(good)
    name, want = bad["outputs"][3][2], bad["outputs"][3][4]
    bad["outputs"][3][4] = want[:2] + [want[2] + 1] + want[3:]
    ok, message = hidden_outputs.judge(lab, cell, [bad], files)
    assert not ok and f"hidden case {name}" in message and "first difference at step 2" in message
    assert str(want[2]) not in message.split("step 2")[1] and ", ".join(map(str, want[:3])) not in message

    short = copy.deepcopy(good)
    short["outputs"][0][4] = short["outputs"][0][4][:-1]
    assert "stopped at step" in hidden_outputs.judge(lab, cell, [short], files)[1]


@pytest.mark.parametrize("tamper, words", [
    (lambda p: [], "reported no outputs"),
    (lambda p: [p, p], "reported 2 times"),
    (lambda p: [dict(p, outputs=p["outputs"][1:])], "were due"),
    (lambda p: [dict(p, cell="greedy-hidden")], "malformed"),
    (lambda p: [dict(p, outputs=[r[:4] for r in p["outputs"]])], "malformed"),
    (lambda p: [dict(p, outputs=p["outputs"] + p["outputs"][:1])], "malformed"),
])
def test_judge_refuses_a_report_a_submission_tampered_with(tamper, words):
    files = {"golden": hidden_outputs.load("golden")}
    good = _payload("lab01_naive_decode", "sample-hidden", files)
    ok, message = hidden_outputs.judge("lab01_naive_decode", "sample-hidden", tamper(good), files)
    assert not ok and words in message, message


def test_compare_fields():
    assert hidden_outputs.compare("chosen_logits", [1.0, 2.00005], [1.0, 2.0]) is None
    assert "step 1" in hidden_outputs.compare("chosen_logits", [1.0, 2.001], [1.0, 2.0])
    assert "not a list of integers" in hidden_outputs.compare("token_ids", [1, True], [1, 1])
    assert hidden_outputs.compare("tokens_processed", 12, 12) is None and hidden_outputs.compare("tokens_processed", 11, 12)
    assert "completion 1" in hidden_outputs.compare("completions", [[1, 2], [3, 5]], [[1, 2], [3, 4]])


def test_every_spec_names_a_hidden_test_cell_that_reports_and_no_hidden_cell_reads_golden_files():
    cells = {}
    for lab in course_paths.all_labs():
        for cell in nbformat.read(lab.source, as_version=4).cells:
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid:
                cells[(lab.name, gid)] = cell.source
    for key in hidden_outputs.SPECS:
        assert key in cells and "BEGIN HIDDEN TESTS" in cells[key], key
        assert f'HiddenReport("{key[0]}", "{key[1]}")' in cells[key] and "report.submit()" in cells[key], key
    for key, source in cells.items():
        if "HiddenReport(" in source:
            assert key in hidden_outputs.SPECS, key
        # the kernel never opens a hidden golden file: it has no way to, once sandboxed
        assert "HIDDEN_GOLDEN" not in source and "autograder/hidden" not in source, key


# ---------------------------------------------------------------- the sandbox itself



@contextlib.contextmanager
def make_box(folder, **limits):
    mode = isolation.choose()  # raises, saying what is missing, where no sandbox can be made: `make sandbox`
    inputs = folder / "inputs"
    inputs.mkdir(parents=True)
    (inputs / "golden.json").write_text('{"cases": []}')
    with (uids.claimed_uid() if mode == bubblewrap.ROOT else contextlib.nullcontext()) as uid:
        sandbox = bubblewrap.Sandbox(runtime=str(folder / "run"), cases=str(folder / "cases"), uid=uid,
                                     inputs=str(inputs), **{"memory_gb": 2, "cpu_seconds": 30, "disk_mb": 64, **limits})
        sandbox.prepare()
        yield sandbox


@pytest.fixture
def box(tmp_path):
    with make_box(tmp_path) as sandbox:
        yield sandbox


def run_in(box, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(box.wrap(["/bin/sh", "-c", script]), capture_output=True, text=True, timeout=60)


def test_sandbox_sees_no_hidden_data_and_cannot_write_outside_its_folder(box):
    r = run_in(box, f"""
        id -u
        ls {REPO} | tr '\\n' ' '; echo
        ls {REPO}/autograder/hidden | wc -l
        for p in {" ".join(INSTRUCTOR_PACKAGES)}; do ls {REPO}/autograder/$p | wc -l; done | tr '\\n' ' '; echo
        cat {HIDDEN}/golden.json >/dev/null 2>&1 && echo READ-HIDDEN
        for f in / /etc /root {REPO} {REPO}/miniengine {REPO}/.venv; do touch $f/x 2>/dev/null && echo WROTE $f; done
        touch x ~/y /tmp/z && echo OWN-FOLDERS-OK
        ls {box.cases} | wc -l
    """)
    lines = r.stdout.split("\n")
    assert lines[0] == str(os.getuid() if box.uid is None else box.uid), r.stdout + r.stderr
    assert lines[1].split() == ["autograder", "data", "miniengine"]  # no labs/, course/, .git
    assert lines[2] == "0"  # autograder/hidden is an empty folder inside
    # so is each of the instructors' packages (qa/design/: the design parts' references and baselines), which the
    # student edition does not hold either; each is there outside, so an empty listing inside says the mask works
    assert lines[3].split() == ["0"] * len(INSTRUCTOR_PACKAGES), lines[3]
    assert all(any((REPO / "autograder" / p).iterdir()) for p in INSTRUCTOR_PACKAGES)
    assert "READ-HIDDEN" not in r.stdout and "WROTE" not in r.stdout
    assert "OWN-FOLDERS-OK" in r.stdout
    assert lines[-2] == "0"  # hidden inputs appear only while a hidden test cell runs
    box.show_hidden_inputs(True)
    assert run_in(box, f"ls {box.cases}").stdout.split() == ["golden.json"]
    box.show_hidden_inputs(False)
    assert run_in(box, f"ls {box.cases}").stdout.split() == []


def test_sandbox_has_no_network_no_view_of_other_processes_and_limits(box):
    r = run_in(box, """
        ls /sys/class/net 2>/dev/null | tr '\\n' ' '; echo
        ls /proc | grep -c '^[0-9]'
        kill -STOP 1 2>/dev/null && echo SIGNALLED-INIT
        cat /proc/self/limits
    """)
    lines = r.stdout.split("\n")
    assert lines[0].split() in ([], ["lo"]), r.stdout
    assert int(lines[1]) <= 5, r.stdout  # bwrap's init, the shell and its children: no grader, no other kernel
    if box.uid is not None:  # ROOT: bwrap's init is root's; in USERNS it is the sandbox's own (README, trust model)
        assert "SIGNALLED-INIT" not in r.stdout
    limits = {line[:26].strip(): line[26:].split()[0] for line in lines if line.startswith("Max ")}
    assert limits["Max processes"] == str(box.max_processes)
    assert limits["Max file size"] == str(box.max_file_mb << 20)
    assert limits["Max address space"] == str(int(2e9))
    assert limits["Max cpu time"] == "30" and limits["Max core file size"] == "0"


def test_everything_the_sandbox_started_dies_with_it(box):
    import psutil

    marker = f"sleep 300 # sandbox-test-{time.time_ns()}"
    r = run_in(box, f"setsid sh -c '{marker}' & (sh -c '{marker}' &) ; sleep 0.2; echo started")
    assert "started" in r.stdout
    time.sleep(0.5)
    left = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    assert left == []


def test_one_size_caps_everything_the_sandbox_writes(box):
    """Working folder, /tmp and HOME share one tmpfs (64 MB here): the write that passes it fails with "No space
    left", and nothing else in the sandbox is writable, its root included (a user namespace owns its root)."""
    r = run_in(box, """
        dd if=/dev/zero of=a bs=1M count=30 2>/dev/null && echo WORK-30
        dd if=/dev/zero of=/tmp/b bs=1M count=30 2>/dev/null && echo TMP-30
        dd if=/dev/zero of=$HOME/c bs=1M count=30 2>&1 | grep -o 'No space left on device'
        for f in / /usr /etc /home /dev /proc/x; do touch $f/x 2>/dev/null && echo WROTE $f; done
        echo ok > /dev/null && echo ok > /dev/shm/x && echo DEVICES-OK
    """)
    assert r.stdout.split("\n")[:3] == ["WORK-30", "TMP-30", "No space left on device"], r.stdout + r.stderr
    assert "WROTE" not in r.stdout and "DEVICES-OK" in r.stdout, r.stdout + r.stderr


def test_the_runtime_folder_is_closed_to_the_kernel_once_its_sockets_exist(box):
    """The runtime folder (the kernel's sockets, on the host's disk) is writable while the kernel starts; then, as
    root, it goes back to root and the kernel can create no file there. As a normal user the kernel has the
    grader's uid, so the folder stays writable: the one place left open (autograder/README.md, trust model)."""
    write = f"touch {box.runtime}/x 2>/dev/null && echo WROTE"
    assert "WROTE" in run_in(box, write.replace("/x", "/socket")).stdout
    box.close_runtime()
    assert ("WROTE" in run_in(box, write).stdout) == (box.uid is None)


def test_a_sandbox_at_its_process_limit_leaves_another_sandbox_its_own(tmp_path):
    """RLIMIT_NPROC caps each sandbox alone, in both modes: a uid per student (root), or the process count of the
    sandbox's own user namespace (a normal user, where every kernel has the instructor's uid)."""
    with make_box(tmp_path / "a", max_processes=20) as a, make_box(tmp_path / "b", max_processes=20) as b:
        fill = ("import os, time\nstarted = 0\nfor _ in range(40):\n    try:\n        if os.fork() == 0:\n"
                "            time.sleep(30)\n            os._exit(0)\n        started += 1\n    except OSError:\n"
                "        pass\nprint(started, flush=True)\ntime.sleep(30)")
        full = subprocess.Popen(a.wrap(["python", "-c", fill]), stdout=subprocess.PIPE, text=True)
        try:
            assert 10 <= int(full.stdout.readline()) < 20  # 20 less python itself (and bwrap's init, which a user namespace counts)
            r = run_in(b, "for i in $(seq 10); do sleep 1 & done; wait; echo TEN-STARTED")
            assert r.stdout.strip() == "TEN-STARTED", r.stdout + r.stderr
        finally:
            full.kill()
            full.wait()


def test_a_cgroup_caps_the_memory_of_the_whole_sandbox_where_one_can_be_made(tmp_path):
    """As root on a machine with a memory cgroup (v2, or v1 as here): two processes of 150 MB each pass a 0.25 GB
    cap together, and the OOM killer acts inside the sandbox; with no address-space limit. Elsewhere: the grader
    records that RLIMIT_AS per process is the cap."""
    from autograder.sandbox import cgroups

    found = cgroups.find()
    if found is None:
        assert os.geteuid() != 0 or not any(m[1].startswith("cgroup") for m in cgroups._mounts())
        assert isolation.memory_cap_name(None, 6) == "RLIMIT_AS 6 GB per process"
        return
    folder = cgroups.create(*found, 0.25)
    try:
        with make_box(tmp_path, memory_gb=0, cgroup=str(folder)) as sandbox:
            use = "import numpy as np; a = np.empty(150 << 20, np.uint8); a[::4096] = 1; import time; time.sleep(3)"
            r = run_in(sandbox, f"grep 'Max address space' /proc/self/limits; "
                                f"python -c '{use}' & python -c '{use}'; wait; echo DONE")
        assert "unlimited" in r.stdout.split("\n")[0] and "DONE" in r.stdout, r.stdout + r.stderr
        assert cgroups.ran_out(folder) == "oom"
    finally:
        cgroups.remove(folder)  # (a process the OOM killer ended may still be on its way out: killed again)
        assert not folder.exists()


def test_a_kernel_that_never_starts_fails_every_cell_instead_of_passing_it(tmp_path):
    """No error output means full points to nbgrader: a notebook that never ran must not look like that."""
    from nbformat.v4 import new_code_cell, new_notebook

    from autograder.notebooks.execute import NOT_RUN, GuardedExecute

    nb = new_notebook(cells=[new_code_cell("x = 1"), new_code_cell("assert x == 1")])
    out, _ = GuardedExecute(kernel_name="no-such-kernel", timeout=5).preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    assert [c.outputs[0]["ename"] for c in out.cells] == [NOT_RUN, NOT_RUN]
    assert "not run: the grading kernel failed" in out.cells[1].outputs[0]["evalue"]


def test_grading_refuses_where_no_sandbox_can_be_made_and_says_what_failed_and_how_to_fix_it(monkeypatch):
    """No bwrap: install it. A normal user whose kernel refuses user namespaces: what bwrap said, the settings
    that allow them, and root as the other way."""
    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    with pytest.raises(isolation.Unavailable, match=r"bwrap is not installed: install the bubblewrap package "
                                                    r"\(Debian/Ubuntu: sudo apt-get install bubblewrap"):
        isolation.choose()
    monkeypatch.setattr(isolation.shutil, "which", lambda name: "/usr/bin/bwrap")
    monkeypatch.setattr(isolation.os, "geteuid", lambda: 1000)
    refused = subprocess.CompletedProcess([], 1, "", "bwrap: No permissions to create new namespace")
    monkeypatch.setattr(isolation.subprocess, "run", lambda *a, **k: refused)
    with pytest.raises(isolation.Unavailable) as e:
        isolation.choose()
    assert str(e.value) == ("not root (uid 1000), so bwrap needs an unprivileged user namespace, and it could not make "
                            "one: bwrap: No permissions to create new namespace. To fix it, " + isolation.ENABLE_USERNS)
    assert "user.max_user_namespaces" in str(e.value) and "grade as root" in str(e.value)


def test_concurrent_claims_never_share_a_uid():
    with uids.claimed_uid() as a, uids.claimed_uid() as b:
        assert a != b
        with uids.claimed_uid() as c:
            assert c not in (a, b)


def test_the_mine_handed_in_is_read_only_inside_and_named_by_its_variable(tmp_path):
    from autograder.grade.submissions import snapshot_mine

    handed = tmp_path / "alice" / "mine"
    handed.mkdir(parents=True)
    (handed / "lab01.py").write_text("def sample(logits, params, position):\n    return 0\n")
    (handed / "lab01.status.json").write_text("{}")
    copy = tmp_path / "grader" / "mine"
    notes = snapshot_mine(handed, copy)
    assert notes == [] and sorted(p.name for p in copy.iterdir()) == ["lab01.py"]
    with make_box(tmp_path / "box", mine=str(copy)) as sandbox:
        r = run_in(sandbox, f"""
            echo "$MINIENGINE_MINE"
            ls {bubblewrap.MINE}
            head -1 {bubblewrap.MINE}/lab01.py
            touch {bubblewrap.MINE}/x 2>/dev/null && echo WROTE
            echo gone > {bubblewrap.MINE}/lab01.py 2>/dev/null && echo OVERWROTE
            ls {handed} {copy} 2>/dev/null | wc -l
        """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[:3] == [bubblewrap.MINE, "lab01.py", "def sample(logits, params, position):"], r.stdout
    assert "WROTE" not in r.stdout and "OVERWROTE" not in r.stdout
    assert lines[3] == "0"  # neither the folder handed in nor the grader's copy is there: only the mount at MINE
