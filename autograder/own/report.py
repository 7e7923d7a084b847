"""What a lab's last cell prints: the table of parts (whose, and why), and the visible golden runs served."""
from __future__ import annotations

import dataclasses
import json
import time

from autograder.own.registry import APART, CLOCK, LOSSY, PLUGGED
from autograder.own.status import first_line


@dataclasses.dataclass
class Served:
    exact: int
    total: int
    differ: list  # "name: step s, token t instead of u", one per run that differs
    error: str = ""  # what the engine raised, if it did
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error and self.exact == self.total

    def line(self) -> str:
        if self.error:
            return f"the engine raised {self.error}"
        head = f"{self.exact}/{self.total} visible golden runs token-exact ({self.seconds:.1f} s)"
        if self.differ:
            more = f" and {len(self.differ) - 3} more" if len(self.differ) > 3 else ""
            head += "; differ: " + "; ".join(self.differ[:3]) + more
        return head


def golden_cases() -> list[dict]:
    from miniengine import paths

    return json.loads((paths.GOLDEN / "visible.json").read_text(encoding="utf-8"))["cases"]


def serve(llm, cases) -> Served:
    """Every case through ``llm`` at once, step by step with a cap, compared token for token with its golden run."""
    from miniengine.sampling import SamplingParams

    start = time.monotonic()
    try:
        ids = [llm.add_request(c["prompt_token_ids"], SamplingParams(**c["params"])) for c in cases]
        seqs = [llm.engine.requests[i] for i in ids]
        cap = 4 * sum(c["params"]["max_tokens"] for c in cases) + 100  # a policy that stalls cannot loop forever
        steps = 0
        while llm.has_unfinished_requests():
            if steps == cap:
                raise RuntimeError(f"the requests did not finish in {cap} engine steps")
            llm.step()
            steps += 1
    except Exception as e:  # the student's part raised inside the engine: reported, and the course's take over
        for rid in list(getattr(llm.engine, "requests", {})):
            try:
                llm.abort(rid)
            except Exception:
                pass
        return Served(0, len(cases), [], first_line(e), time.monotonic() - start)
    differ = []
    for c, seq in zip(cases, seqs):
        got, want = [int(t) for t in seq.output_token_ids], c["token_ids"]
        if got != want:
            step = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            shown = lambda run: str(run[step]) if step < len(run) else "none"  # noqa: E731
            differ.append(f"{c['name']} at step {step}: token {shown(got)} instead of {shown(want)}")
    return Served(len(cases) - len(differ), len(cases), differ, "", time.monotonic() - start)


def whose(v) -> str:
    if v.yours:
        return "yours"
    return "course's" if v.part.course else "none"


WHERE = {CLOCK: "clock", LOSSY: "beside", APART: "apart"}


def where(v, lab: int) -> tuple[str, str]:
    """(where the part is, a note): in LLM, superseded, the simulator's clock, beside (lossy) or apart."""
    from autograder.own.assemble import placement

    if v.part.kind == PLUGGED:
        place = placement(v.part.key, lab)
        return ("in LLM", "") if place == "in this LLM" else ("superseded", place.removeprefix("superseded "))
    return WHERE[v.part.kind], v.part.note


def table(verdicts: dict, lab: int, refused: dict, replaced: dict) -> str:
    rows = []
    for v in verdicts.values():
        key = v.part.key
        who = "course's" if key in refused or key in replaced else whose(v)
        place, note = where(v, lab)
        why = refused.get(key) or replaced.get(key) or v.why
        rows.append((v.part.title, f"{v.part.lab:02d}", who, place, why + (f"; {note}" if note else "")))
    head = ("part", "lab", "whose", "where", "why")
    w = [max(len(r[i]) for r in rows + [head]) for i in range(4)]
    return "\n".join(f"  {a:<{w[0]}}  {b:<{w[1]}}  {c:<{w[2]}}  {d:<{w[3]}}  {e}" for a, b, c, d, e in [head] + rows)
