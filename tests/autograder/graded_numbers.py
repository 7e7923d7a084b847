"""The labs' graded numbers as their solutions compute them, and where a notebook's text or outputs show one.

Lectures never print a lab's answer (tests/notebooks/test_lecture_answers.py holds the rule for code):
tests/autograder/test_regress.py executes every lecture and looks for these values in what each one printed or wrote.  The values come from the labs' own answer cells, run
here by the same helpers that check those cells against the course's formulas (tests/autograder/test_labNN_literals.py).
A value of fewer than three significant digits (a best gamma of 3, say) is too common to look for.
"""
from __future__ import annotations

import importlib
import json
import math
import re

from lab_literals import observed
from test_lab01_literals import lab01_calls, lab01_solution
from test_lab02_literals import lab02_calls, lab02_solution
from test_lab03_literals import LAB03_ANSWERS, cell_calls, lab03_sources
from test_lab04_design import cell as lab04_cell
from test_lab05_design import cell as lab05_cell
from test_lab06_design import cell as lab06_cell


def _lab01() -> dict:
    from miniengine.model import load_model
    from miniengine.paths import TARGET

    (_, (_, tolerances), _), = [c for c in lab01_calls("numbers") if c[0] == "report_numbers"]
    got = lab01_solution("numbers-answers", {"model": load_model(TARGET)})
    return {name: got[name] for name in tolerances}


def _lab02() -> dict:
    (_, (_, tolerances), _), = lab02_calls("numbers-hidden")
    got = lab02_solution()
    return {name: got[name] for name in tolerances}


def _lab03() -> dict:
    import autograder.labs

    lab = importlib.reload(autograder.labs).pristine("lab03")
    sources, ns = lab03_sources(), {"__name__": "__main__"}
    for gid in ("setup",) + LAB03_ANSWERS:
        exec(compile(sources[gid], f"<cell {gid}>", "exec"), ns)
    got = {}
    for gid in ("numbers-roofline-hidden", "numbers-memory-hidden"):
        (_, (namespace, tolerances), _), = cell_calls(lab, ns, sources[gid])
        got |= {label.split(" ")[0]: v for label, v in observed(lab.report_answer_values, namespace, tolerances).items()}
    return got


def _lab04() -> dict:
    ns: dict = {"__name__": "__main__"}
    for gid in ("fits", "ContinuousBatching", "StaticBatching", "numbers-answers"):
        if gid == "numbers-answers":
            exec("from miniengine.serving import metrics, simulator as sim\n"
                 "from miniengine.cost.roofline import GPUS, CostModel, llama3_8b", ns)  # the lab's setup cell's
        exec(lab04_cell(gid), ns)
    return {k: ns[k] for k in ("HOL_TTFT_RATIO", "STATIC_ATTAINMENT", "CONTINUOUS_MAX_RATE")}


def _lab05() -> dict:
    ns: dict = {"__name__": "__main__"}
    exec("from collections import deque", ns)  # the lab's setup cell's
    for gid in ("BlockManager", "numbers-answers"):
        exec(lab05_cell(gid), ns)
    return {k: ns[k] for k in ("FORK_BLOCKS", "SAVED_SHARE")}


def _lab06() -> dict:
    ns: dict = {}
    exec(lab06_cell("numbers-answers"), ns)
    return {k: v for k, v in ns.items() if k.isupper() and isinstance(v, (int, float))}


def graded_numbers() -> dict[str, float]:
    """{"lab01 tokens_naive": 599500, ...}: every graded number of every lab that has them."""
    found = {}
    for lab, values in (("lab01", _lab01()), ("lab02", _lab02()), ("lab03", _lab03()), ("lab04", _lab04()),
                         ("lab05", _lab05()), ("lab06", _lab06())):
        found |= {f"{lab} {name}": v for name, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return found


def spellings(value: float) -> set[str]:
    """How a notebook would print ``value``: with or without thousands separators, rounded to 3 or more significant
    digits; empty for a value of fewer than three significant digits."""
    if not math.isfinite(value) or value == 0:
        return set()
    if float(value).is_integer():
        n = int(value)
        return {f"{n:,}", str(n)} if len(str(abs(n)).strip("0")) >= 3 else set()
    digits = 3 - int(math.floor(math.log10(abs(value)))) - 1  # decimals that give three significant digits
    shown = {f"{value:.{d}f}" for d in range(max(digits, 0), max(digits, 0) + 3)}
    shown |= {f"{value:,.{d}f}" for d in range(max(digits, 0), max(digits, 0) + 3)}
    # "1.00" for 1.00003 is any ratio near one: only spellings with three significant digits that are not all zeros
    return {s for s in shown if len(re.sub(r"[^0-9]", "", s).strip("0")) >= 3}


def text_of(nb: dict) -> str:
    """Everything a reader of an executed notebook sees: markdown, and every text output of every cell."""
    parts = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            parts.append("".join(cell["source"]))
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            for mime in ("text/plain", "text/markdown", "text/html"):
                parts.append("".join(out.get("data", {}).get(mime, "")))
    return "\n".join(parts)


def answers_shown(nb: dict, numbers: dict[str, float]) -> list[str]:
    """The graded numbers an executed notebook shows, as 'lab01 kv_bytes_per_token (12,288)'."""
    text = text_of(nb)
    shown = []
    for name, value in numbers.items():
        for s in sorted(spellings(value)):
            if re.search(rf"(?<![\d.,]){re.escape(s)}(?![\d]|[.,]\d)", text):
                shown.append(f"{name} ({s})")
                break
    return shown


def load(path) -> dict:
    return json.loads(open(path, encoding="utf-8").read())
