"""A real browser drives JupyterLab the way a student does (issue 12, item 7).

JupyterLab is started as `make lab` starts it (the venv's `jupyter lab`, --notebook-dir, --allow-root as root), but
headless, on a free port, with a token of our own, and with HOME, Jupyter's, IPython's and matplotlib's folders all
inside the test's temp folder.  Headless Chromium (Debian's `chromium` package; `make browser` installs it) then:

1. opens the student's lab 01, a released lab 01 with the solutions filled in (tests/autograder/fixtures/lab01/a_correct.ipynb,
   with FAST = True), runs it with the Run menu's "Run All Cells", and waits until every cell has run;
2. sees each visible test cell's last printed line ("greedy: visible tests passed", ...) under it, no error;
3. saves with Ctrl+S and finds the outputs in the notebook on disk;
4. opens lecture 01, the notebook with the ipywidgets explorer (lab 01 itself has no widget: its one widget is
   lecture 01's DecodingExplorer, from miniengine/course/widgets.py), runs it all (FAST = True), sees the explorer's
   slider and buttons render, clicks "next step" and sees the kernel answer through the widget;
5. finds no "Would you like to get notified about official Jupyter news?" prompt (the venv's overrides.json, which
   `make setup` writes, turns it off), and nbgrader's instructor tools there: this is the instructor edition.

A second JupyterLab is set up as `make lab` sets up the student edition (the Makefile's lab-tools rule, with
EDITION=student, into this test's own config folder): no news prompt, no Nbgrader menu, no "Create Assignment"
panel, and no formgrader behind /formgrader.

It skips only where no chromium executable is found; anything else fails, with a screenshot and the end of
JupyterLab's log in the message.  The kernels run torch on one thread (OMP_NUM_THREADS=1, as tests/conftest.py
does for the tests): with two on two cores shared with other work, lab 01's Run All once took minutes.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from miniengine.paths import REPO_ROOT

pytestmark = pytest.mark.slow

BUDGET_S = 240  # hard bound on the whole test; a run takes about 50-65 s on two shared cores
NEWS = "Would you like to get notified about official Jupyter news?"  # JupyterLab 4's toast, until answered
TOOLS = {"the Nbgrader menu": '.lm-MenuBar-itemLabel:text-is("Nbgrader")',  # nbgrader 0.9's instructor plugins
         "the Create Assignment panel": "#nbgrader-create_assignemnt"}     # (sic: nbgrader's own widget id)
LAB_FIXTURE = REPO_ROOT / "tests" / "autograder" / "fixtures" / "lab01" / "a_correct.ipynb"
LAB_PATH = "student/lab01_naive_decode/lab01_naive_decode.ipynb"  # where `autograder release` puts lab 01
LECTURE = REPO_ROOT / "lectures" / "01_inference_workload.ipynb"
LECTURE_PATH = "lectures/01_inference_workload.ipynb"


class Deadline:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def ms(self) -> float:
        """What is left, in milliseconds, for a Playwright timeout (at least 1 s, so the call fails readably)."""
        return max(1.0, self.left()) * 1000


def fast_copy(src: Path, dst: Path) -> dict:
    """Copy a notebook with its parameters cell's `FAST = False` set to True; returns the notebook."""
    nb = json.loads(src.read_text())
    params = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    source = "".join(params["source"])
    fast, n = re.subn(r"^FAST = False\b", "FAST = True ", source, flags=re.M)
    assert n == 1, f"{src}: its parameters cell has no line `FAST = False` to set to True:\n{source}"
    params["source"] = fast
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(nb, indent=1))
    return nb


def code_cells_to_run(nb: dict) -> int:
    """JupyterLab runs a code cell only when it has code: empty cells get no execution count."""
    return sum(1 for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def isolated_env(tmp: Path) -> dict[str, str]:
    """HOME and every folder Jupyter, IPython, matplotlib and Chromium write to, inside tmp (the Makefile's exports,
    moved there)."""
    home = tmp / "home"
    env = {
        "HOME": home, "XDG_CONFIG_HOME": home / ".config", "XDG_CACHE_HOME": home / ".cache",
        "XDG_DATA_HOME": home / ".local" / "share", "XDG_RUNTIME_DIR": tmp / "xdg-runtime",
        "JUPYTER_CONFIG_DIR": tmp / "jupyter-config", "JUPYTER_DATA_DIR": tmp / "jupyter-data",
        "JUPYTER_RUNTIME_DIR": tmp / "jupyter-runtime", "IPYTHONDIR": tmp / "ipython",
        "MPLCONFIGDIR": tmp / "matplotlib",
    }
    for path in env.values():
        path.mkdir(parents=True, exist_ok=True)
    env["XDG_RUNTIME_DIR"].chmod(0o700)
    # matplotlib's font list takes seconds to build on two busy cores: start from the venv's copy where there is one
    for cache in [Path(os.environ.get("MPLCONFIGDIR", "/nonexistent")), REPO_ROOT / ".venv" / "home" / "matplotlib"]:
        fontlists = sorted(cache.glob("fontlist-*.json")) if cache.is_dir() else []
        if fontlists:
            for f in fontlists:
                shutil.copy(f, env["MPLCONFIGDIR"] / f.name)
            break
    out = {k: str(v) for k, v in env.items()}
    out["JUPYTER_PLATFORM_DIRS"] = "1"
    # One torch thread in the kernels, as tests/conftest.py has for the tests: with two threads on two cores that
    # something else also uses, OpenMP's waiting threads made lab 01's Run All take minutes instead of seconds.
    out["OMP_NUM_THREADS"] = "1"
    out["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return out


def lab_tools(edition: str, config_dir: str) -> None:
    """What `make lab` does to JupyterLab's nbgrader tools in ``edition``, into ``config_dir`` instead of the venv's."""
    r = subprocess.run(["make", "-s", "-C", str(REPO_ROOT), "lab-tools", f"EDITION={edition}",
                        f"LAB_CONFIG_DIR={config_dir}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"make lab-tools EDITION={edition} failed:\n{r.stdout}{r.stderr}"


def news_is_off() -> None:
    """The venv's JupyterLab settings that `make setup` writes: without them the news toast covers the notebooks."""
    overrides = Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    setting = (json.loads(overrides.read_text()) if overrides.exists() else {}).get(
        "@jupyterlab/apputils-extension:notification", {})
    assert setting.get("fetchNews") == "false", f"{overrides} does not turn the news prompt off: run `make setup`"


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def log_tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError as e:
        return f"(no log: {e})"


def start_jupyterlab(nbdir: Path, port: int, token: str, log: Path, deadline: Deadline) -> subprocess.Popen:
    jupyter = Path(sys.executable).parent / "jupyter"
    assert jupyter.exists(), f"{jupyter} is missing: `make setup` installs JupyterLab into the venv"
    cmd = [str(jupyter), "lab", f"--notebook-dir={nbdir}", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")  # as the Makefile's lab target does
    with open(log, "wb") as out:
        server = subprocess.Popen(cmd, cwd=nbdir, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    url = f"http://127.0.0.1:{port}/api/status?token={token}"
    while True:
        if server.poll() is not None:
            raise AssertionError(f"JupyterLab exited with status {server.returncode} before it answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if deadline.left() < 0:
            raise AssertionError(f"JupyterLab did not answer on port {port} in time")
        time.sleep(0.3)


def stop_jupyterlab(server: subprocess.Popen) -> None:
    """SIGTERM lets the server shut its kernels down; whatever of its process tree is left is then killed by pid."""
    import psutil

    try:
        tree = psutil.Process(server.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
    for proc in tree:
        try:
            proc.wait(timeout=0 if proc.status() == psutil.STATUS_ZOMBIE else 5)
        except psutil.TimeoutExpired:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


PROMPTS_JS = """() => {
  const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
  if (!nb) return null;
  const prompts = [...nb.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent.trim());
  const indicator = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator');
  return {numbered: prompts.filter(p => /^\\[\\d+\\]:$/.test(p)).length,
          running: prompts.filter(p => p.includes('*')).length,
          status: indicator ? indicator.dataset.status : null};
}"""


def open_notebook(page, base: str, path: str, token: str, deadline: Deadline) -> None:
    from playwright.sync_api import expect

    page.goto(f"{base}/lab/tree/{path}?token={token}", timeout=deadline.ms())
    name = Path(path).name
    expect(page.locator(f'.lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current:has-text("{name}")')).to_be_visible(
        timeout=deadline.ms())
    expect(page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").first).to_be_visible(
        timeout=deadline.ms())
    # the kernel has started and is idle (the status bar says so once the kernel has answered)
    kernel = page.locator(f'.jp-StatusBar-TextItem[title="Change kernel for {name}"]')
    expect(kernel).to_have_text(re.compile(r"\| Idle$"), timeout=deadline.ms())


def run_all_cells(page, expected: int, deadline: Deadline) -> dict:
    """Run > Run All Cells, then wait until all `expected` code cells have an execution count, or until the run
    stopped (no cell queued, kernel idle for 2 s: a cell raised)."""
    page.locator('.lm-MenuBar-itemLabel:text-is("Run")').click(timeout=deadline.ms())
    # a menu item stays disabled (and a click on it does nothing) until the notebook and its kernel are ready
    page.locator('.lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel:text-is("Run All Cells")').click(
        timeout=deadline.ms())
    started = time.monotonic()
    while True:  # the run has started once a cell is queued or numbered
        state = page.evaluate(PROMPTS_JS)
        if state and (state["running"] or state["numbered"]):
            break
        if time.monotonic() - started > 15 or deadline.left() < 0:
            raise AssertionError(f"Run > Run All Cells started no cell in 15 s: {state}")
        time.sleep(0.2)
    idle_since = None
    while True:
        state = page.evaluate(PROMPTS_JS)
        if state and state["running"] == 0 and state["numbered"] >= expected:
            return state
        if state and state["running"] == 0 and state["status"] == "idle":
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since > 2:
                return state  # the run stopped short; the caller reports which cell failed
        else:
            idle_since = None
        if deadline.left() < 0:
            raise AssertionError(f"Run All Cells did not finish in time: {state}")
        time.sleep(0.5)


def save_notebook(page, path: Path, deadline: Deadline) -> dict:
    """Ctrl+S in the current notebook; returns the notebook as saved on disk."""
    from playwright.sync_api import expect

    before = path.stat().st_mtime_ns
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").click(position={"x": 5, "y": 5})
    page.keyboard.press("Control+s")
    expect(page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current.jp-mod-dirty")).to_have_count(
        0, timeout=deadline.ms())
    while path.stat().st_mtime_ns == before:
        if deadline.left() < 0:
            raise AssertionError(f"Ctrl+S did not write {path}")
        time.sleep(0.2)
    return json.loads(path.read_text())


def errors_in(nb: dict) -> list[str]:
    return [f"cell {i}: {o['ename']}: {o['evalue']}" for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
            for o in c.get("outputs", []) if o["output_type"] == "error"]


def stdout_of(cell: dict) -> str:
    return "".join("".join(o["text"]) for o in cell.get("outputs", [])
                   if o["output_type"] == "stream" and o["name"] == "stdout")


def test_student_runs_lab01_and_the_explorer_in_jupyterlab(tmp_path, monkeypatch):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium executable: install Debian's `chromium` package (`make browser` does, as root)")
    try:
        from playwright.sync_api import Error as PlaywrightError, expect, sync_playwright
    except ImportError as e:
        pytest.fail(f"playwright is not installed ({e}): `make setup` installs it (the `test` extra)")

    deadline = Deadline(BUDGET_S)
    nbdir = tmp_path / "notebooks"
    lab = fast_copy(LAB_FIXTURE, nbdir / LAB_PATH)
    lecture = fast_copy(LECTURE, nbdir / LECTURE_PATH)
    news_is_off()
    for key, value in isolated_env(tmp_path).items():
        monkeypatch.setenv(key, value)  # JupyterLab, its kernels, the Playwright driver and Chromium all inherit it
    lab_tools("instructor", os.environ["JUPYTER_CONFIG_DIR"])
    port, token = free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "jupyterlab.log"
    screenshot = tmp_path / "failure.png"
    started = time.monotonic()

    def step(name: str) -> str:  # pytest -s shows where the time goes
        print(f"{time.monotonic() - started:6.1f} s  {name}", flush=True)
        return name

    server = browser = page = None
    failure = ""
    stage = step("starting JupyterLab")
    try:
        server = start_jupyterlab(nbdir, port, token, log, deadline)
        with sync_playwright() as pw:
            try:
                stage = step(f"starting {chromium}")
                browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"], timeout=deadline.ms())
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.set_default_timeout(deadline.ms())

                stage = step(f"opening {LAB_PATH}")
                open_notebook(page, base, LAB_PATH, token, deadline)
                stage = step("running lab 01's cells (Run > Run All Cells)")
                expected = code_cells_to_run(lab)
                state = run_all_cells(page, expected, deadline)

                stage = step("saving lab 01 (Ctrl+S)")
                on_disk = save_notebook(page, nbdir / LAB_PATH, deadline)

                stage = step("checking lab 01's outputs")
                errors = errors_in(on_disk)
                assert not errors, f"lab 01 raised in JupyterLab: {errors}"
                assert state["numbered"] >= expected, f"only {state['numbered']} of {expected} code cells ran: {state}"
                unrun = [i for i, c in enumerate(on_disk["cells"]) if c["cell_type"] == "code"
                         and "".join(c["source"]).strip() and c.get("execution_count") is None]
                assert not unrun, f"the saved notebook has no execution count in code cells {unrun}"
                visible = [c for c in on_disk["cells"]
                           if c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "").endswith("-visible")]
                n_visible = sum(c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "").endswith("-visible")
                                for c in lab["cells"])
                assert len(visible) == n_visible >= 6, f"{n_visible} visible test cells in lab 01, {len(visible)} saved"
                lines = []
                for cell in visible:
                    printed = stdout_of(cell).strip()
                    assert printed, (f"visible test cell {cell['metadata']['nbgrader']['grade_id']} printed nothing "
                                     f"in the saved notebook: {cell.get('outputs')}")
                    lines.append(printed.splitlines()[-1])
                assert sum("visible tests passed" in line for line in lines) >= 4, lines
                assert any("image/png" in o.get("data", {}) for c in on_disk["cells"] for o in c.get("outputs", [])), \
                    "the saved notebook has no plot (the measurement cell's image/png output)"
                # what the student sees: each visible test's last line, rendered under its cell
                for line in lines:
                    shown = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output",
                                         has_text=line)
                    expect(shown).to_have_count(1, timeout=deadline.ms())
                    shown.scroll_into_view_if_needed(timeout=deadline.ms())
                    expect(shown).to_be_visible(timeout=deadline.ms())

                stage = step(f"opening {LECTURE_PATH}")
                open_notebook(page, base, LECTURE_PATH, token, deadline)
                stage = step("running lecture 01's cells (Run > Run All Cells)")
                state = run_all_cells(page, code_cells_to_run(lecture), deadline)
                stage = step("saving lecture 01 (Ctrl+S)")
                errors = errors_in(save_notebook(page, nbdir / LECTURE_PATH, deadline))
                assert not errors, f"lecture 01 raised in JupyterLab: {errors}"
                assert state["numbered"] >= code_cells_to_run(lecture), f"lecture 01 stopped short: {state}"

                stage = step("looking at lecture 01's explorer widget")
                explorer = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output "
                                        ".jupyter-widgets.widget-vbox").filter(has=page.locator(".widget-slider"))
                expect(explorer).to_have_count(1, timeout=deadline.ms())
                explorer.scroll_into_view_if_needed(timeout=deadline.ms())
                for part in [explorer.locator(".widget-slider"),  # temperature
                             explorer.locator(".widget-label", has_text="temperature"),
                             explorer.locator("button.jupyter-button", has_text="next step"),
                             explorer.locator(".widget-output img")]:  # the chart the kernel drew
                    expect(part).to_be_visible(timeout=deadline.ms())
                summary = explorer.locator(".widget-html small")
                expect(summary).to_have_text(re.compile(r"\d+ prompt tokens, 0 generated"), timeout=deadline.ms())
                # a click travels to the kernel, which steps the decoder and updates the widget
                explorer.locator("button.jupyter-button", has_text="next step").click(timeout=deadline.ms())
                expect(summary).to_have_text(re.compile(r"\d+ prompt tokens, 1 generated"), timeout=deadline.ms())

                stage = step("looking for the news prompt and the instructor's tools")
                expect(page.get_by_text(NEWS)).to_have_count(0)  # by now it would long have shown
                for what, selector in TOOLS.items():
                    assert page.locator(selector).count() >= 1, f"the instructor edition's JupyterLab lacks {what}"
                assert http_status(f"{base}/formgrader?token={token}") == 200, "the formgrader is not served"
            except (AssertionError, PlaywrightError) as e:
                shot = "(no page to capture)"
                if page is not None:
                    try:
                        page.screenshot(path=str(screenshot), full_page=False, timeout=10_000)
                        shot = str(screenshot)
                    except PlaywrightError as shot_error:
                        shot = f"(screenshot failed: {shot_error})"
                failure = f"{e}\nscreenshot: {shot}"
            finally:
                if browser is not None:
                    browser.close()
    except AssertionError as e:  # JupyterLab did not start
        failure = str(e)
    finally:
        if server is not None:
            stop_jupyterlab(server)
    step("done")
    if failure:
        pytest.fail(f"browser test failed while {stage}: {failure}\n"
                    f"JupyterLab log: {log}, last lines:\n{log_tail(log)}", pytrace=False)


def test_the_student_edition_has_no_news_prompt_and_no_instructor_tools(tmp_path, monkeypatch):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium executable: install Debian's `chromium` package (`make browser` does, as root)")
    from playwright.sync_api import Error as PlaywrightError, expect, sync_playwright

    deadline = Deadline(120)
    nbdir = tmp_path / "notebooks"
    fast_copy(LAB_FIXTURE, nbdir / LAB_PATH)
    news_is_off()
    for key, value in isolated_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    lab_tools("student", os.environ["JUPYTER_CONFIG_DIR"])
    port, token = free_port(), secrets.token_hex(16)
    base, log, failure = f"http://127.0.0.1:{port}", tmp_path / "jupyterlab.log", ""
    server = start_jupyterlab(nbdir, port, token, log, deadline)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"], timeout=deadline.ms())
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            try:
                open_notebook(page, base, LAB_PATH, token, deadline)
                time.sleep(5)  # the news toast shows as the notebook appears (measured: within a second)
                expect(page.get_by_text(NEWS)).to_have_count(0)
                for what, selector in TOOLS.items():
                    assert page.locator(selector).count() == 0, f"the student edition's JupyterLab shows {what}"
                expect(page.locator(".lm-MenuBar-itemLabel:text-is(\"Run\")")).to_have_count(1)  # the menus did load
                assert http_status(f"{base}/formgrader?token={token}") == 404, "the student edition serves the formgrader"
            except (AssertionError, PlaywrightError) as e:
                page.screenshot(path=str(tmp_path / "failure.png"))
                failure = f"{e}\nscreenshot: {tmp_path / 'failure.png'}"
            finally:
                browser.close()
    finally:
        stop_jupyterlab(server)
    if failure:
        pytest.fail(f"{failure}\nJupyterLab log: {log}, last lines:\n{log_tail(log)}", pytrace=False)
