"""Shared fixtures and settings for every test. The folders mirror the source:

* ``engine/``: miniengine's core (model, attention, sampling, the KV layouts, the engine, serving, spec, TP);
* ``course/``: the course tooling in miniengine/course/ (golden files, training, plots, the command line);
* ``autograder/``: the grading side, its design parts, the kernel probes and the planted-bug fixtures (``fixtures/``);
* ``project/``: the repository as a whole: setup files, import contracts, file sizes;
* ``notebooks/``: the lectures' and labs' conventions, and JupyterLab in a browser.

A test file is named ``test_<the module or subject it tests>.py``; a helper module is not named ``test_*``. A file
marked ``student_edition`` ships in the student edition (autograder/edition/publish.py), so it may read no hidden data
and import no instructors' code: tests/autograder/test_publish.py reads each marked file, and the guard below fails a
marked test that opens anything in autograder/hidden/ while it runs.
"""
import json
import os
import sys

import pytest
import torch

from miniengine.model import Llama, LlamaConfig, load_model
from miniengine.paths import GOLDEN, REPO_ROOT, TARGET
from miniengine.tokenizer import load_tokenizer

# Tests share two cores with whatever else runs; one thread keeps timings steady.  The processes the tests start
# (the command line, benchmarks, ranks) inherit one thread too: with two workers already on two cores, a child
# with two math threads spins against them (`bench chunked --seeds 1` took 7.7 s of CPU with one thread, and ran
# past its 180 s limit with two).
torch.set_num_threads(1)
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_name] = "1"

# Answer sheets (autograder/grade/sheets.py) are named by a hash of everything they depend on, so every test and every
# run of the suite can share them: the first grading of a lab makes its sheet, the others read it. A folder of
# the checkout's build/ (git-ignored), open to the throwaway account that grades as a normal user.
_SHEETS = REPO_ROOT / "build" / "test-sheets"
_SHEETS.mkdir(parents=True, exist_ok=True)
_SHEETS.chmod(0o1777)
os.environ.setdefault("AUTOGRADER_SHEETS_DIR", str(_SHEETS))

# The longest files first: `make test` hands whole files to its two workers in this order (--dist loadfile
# --no-loadscope-reorder), so the long ones start at once and short ones fill in at the end, where one
# long file left alone would keep one core idle. pytest-xdist's own order sorts files by their number of
# tests, which queues verify and regress (two tests each) behind every other file. Verify and regress,
# whose limits are loose (60 s and 30 s a cell), go first, side by side; the planted-bug run, with 10 s a
# cell, after them. Seconds: the last whole run on this 2-core machine.
LONGEST_FIRST = (
    "autograder/test_verify.py",          # 344 s: every lab's solution and stub graded, before the design baselines
    "autograder/test_regress.py",         # 210 s: every lecture
    "autograder/test_fixtures.py",        # 360 s: the planted-bug submissions, graded in one run
    "autograder/test_kernel_probes.py",   # 185 s: nine labs released, 17 attacks graded
    "autograder/test_cli.py",             # 190 s: a student's release, check and grade; limits; messages
    "notebooks/test_browser.py",          # 81 s
    "course/test_golden.py",              # 61 s
    "engine/test_tensor_parallel.py",     # 55 s
    "autograder/test_check.py",           # 34 s
)
TESTS = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.relpath(item.path, TESTS), len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="session", autouse=True)
def mine_folder(tmp_path_factory):
    """The student's saved parts (autograder/own/: labs' last cells, `check`) go to a temporary folder, never mine/."""
    path = tmp_path_factory.mktemp("mine")
    old = os.environ.get("MINIENGINE_MINE")
    os.environ["MINIENGINE_MINE"] = str(path)  # kernels and subprocesses the tests start inherit it
    yield path
    if old is None:
        os.environ.pop("MINIENGINE_MINE", None)
    else:
        os.environ["MINIENGINE_MINE"] = old


@pytest.fixture(scope="session")
def target():
    return load_model(TARGET)


@pytest.fixture(scope="session")
def tok():
    return load_tokenizer(TARGET)


@pytest.fixture(scope="session")
def golden():
    return json.loads((GOLDEN / "visible.json").read_text())


@pytest.fixture(scope="session")
def hidden_golden():
    """The hidden golden runs: instructors' data, which a test marked student_edition may not use (see below)."""
    return json.loads((REPO_ROOT / "autograder" / "hidden" / "golden.json").read_text())


# A test marked student_edition ships to students, whose edition has no autograder/hidden/: any read of it while such a
# test runs fails that test here, in the instructors' own run (an audit hook sees every open() in this process).
_HIDDEN_DIR = str(REPO_ROOT / "autograder" / "hidden") + os.sep
_GUARD = {"on": False}


def _no_hidden_reads(event, args):
    if _GUARD["on"] and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.abspath(os.fsdecode(args[0]))
        if path.startswith(_HIDDEN_DIR):
            raise PermissionError(f"{path}: a test marked student_edition reads hidden data, which the student "
                                  f"edition does not have (unmark it, or leave the hidden data out)")


sys.addaudithook(_no_hidden_reads)


@pytest.fixture(scope="module", autouse=True)
def _student_edition_module_reads_no_hidden_data(request):
    """The same guard while a marked module's own fixtures are made (autouse: before the module's other fixtures)."""
    _GUARD["on"] = request.node.get_closest_marker("student_edition") is not None
    yield
    _GUARD["on"] = False


@pytest.fixture(autouse=True)
def _student_edition_reads_no_hidden_data(request):
    marked = request.node.get_closest_marker("student_edition") is not None
    if marked and "hidden_golden" in request.fixturenames:  # cached by an earlier test, so no read would show
        pytest.fail("a test marked student_edition uses hidden_golden, which the student edition does not have")
    _GUARD["on"] = marked
    yield
    _GUARD["on"] = False


def tiny_config(**overrides) -> LlamaConfig:
    fields = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    fields.update(overrides)
    return LlamaConfig(**fields)


@pytest.fixture
def tiny_gqa():
    """A random GQA model (4 query heads share 2 KV heads), small weights so its logits are not degenerate."""
    torch.manual_seed(0)
    m = Llama(tiny_config())
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(std=0.2)
    return m.eval()
