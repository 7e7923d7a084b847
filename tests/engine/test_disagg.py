"""Prefill/decode disaggregation on the simulator (miniengine/serving/disagg.py)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from miniengine.cost.roofline import GPUS, CostModel, llama3_8b
from miniengine.serving import disagg, metrics, simulator as sim

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)

COST = CostModel(llama3_8b(), GPUS["H100"])


def long_prompts():
    """Chats with some long prompts: the workload where colocated decodes get stalled by prefills."""
    return sim.chat_workload(120, 8.0, seed=1, prompt_mean=2048, output_mean=128)


def test_every_request_gets_all_its_tokens_in_both_arrangements():
    want = {r.id: r.output_len for r in long_prompts()}
    for arrangement in (disagg.colocated(long_prompts(), COST, 4),
                        disagg.disaggregated(long_prompts(), COST, 4, 1, 50e9)):
        got = {t.request_id: len(t.token_times) for t in arrangement.timelines}
        assert got == want, arrangement.name


def test_the_first_token_pays_the_prefill_and_the_rest_pay_the_transfer():
    reqs = [sim.SimRequest(0, 0.0, 1000, 3)]
    run = disagg.disaggregated(reqs, COST, 2, 1, 10e9)
    t = run.timelines[0]
    prefill = COST.forward([1000], [0]).step_time_s
    transfer = 1000 * COST.kv_bytes_per_token / 10e9
    assert t.token_times[0] == pytest.approx(prefill)
    assert t.token_times[1] == pytest.approx(prefill + transfer + COST.forward([1], [1001]).step_time_s)


def test_decodes_are_never_stalled_by_a_prefill_when_disaggregated():
    together = disagg.colocated(long_prompts(), COST, 4)
    apart = disagg.disaggregated(long_prompts(), COST, 4, 1, 50e9)
    worst = {a.name: max(float(np.max(metrics.itl(t))) for t in a.timelines if len(t.token_times) > 1)
             for a in (together, apart)}
    # a colocated step that holds a 2,000-token prefill is far longer than any decode-only step
    assert worst[apart.name] < worst[together.name] / 2, worst


@pytest.mark.parametrize("args, words", [
    ((4, 0, 1e9), "prefill_gpus must be an integer in \\[1, 3\\]"),
    ((4, 4, 1e9), "prefill_gpus must be an integer in \\[1, 3\\]"),
    ((0, 1, 1e9), "gpus must be an integer >= 1"),
    ((4, 1, 0.0), "link_bytes_per_s must be > 0"),
])
def test_bad_arrangements_are_named(args, words):
    with pytest.raises(ValueError, match=words):
        disagg.disaggregated(long_prompts(), COST, *args)


# ---------------------------------------------------------------- python -m miniengine disagg

def cli(capsys, *args):
    """Runs the command in this process (a subprocess would pay torch's import again): (exit code, out, err)."""
    from miniengine.__main__ import main

    try:
        code = main(["disagg", *map(str, args)])
    except SystemExit as e:  # argparse's own errors (a non-integer, an unknown flag) exit through the parser
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


SMALL = ("--requests", 40, "--seeds", 2, "--rate", 16, "--prompt-mean", 4096)


def test_the_cli_prints_colocated_and_every_split_then_one_verdict(capsys):
    code, out, err = cli(capsys, *SMALL)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert "TTFT P50" in lines[1] and "TPOT P99" in lines[1] and "max ITL" in lines[1] and "SLO met" in lines[1]
    names = [line.split("  ")[0] for line in lines[3:7]]
    assert names == ["colocated (4 GPUs)"] + [f"disaggregated ({p} prefill + {4 - p} decode GPUs)" for p in (1, 2, 3)]
    assert re.fullmatch(r"disaggregation \(\d prefill \+ \d decode\): TPOT P99 [\d.]+x lower, "
                        r"TTFT P99 [\d.]+x (lower|higher) than colocated", lines[-1]), lines[-1]


def test_the_cli_table_holds_the_medians_of_compare_splits(capsys):
    code, out, _ = cli(capsys, *SMALL, "--prefill-gpus", 2)
    rows = disagg.compare_splits(lambda s: disagg.workload(40, 16, s, 4096, 128, 8192), COST, 4, [2], 50e9, range(2))
    for name, row in rows.items():
        line = next(line for line in out.splitlines() if line.startswith(name))
        assert line.split()[-5:-1] == [f"{row[m] * 1e3:.1f}" for m in disagg.REPORTED[:4]], line


def test_the_verdict_names_colocated_when_splitting_does_not_pay():
    def row(p, ttft, tpot):
        return {"prefill_gpus": p, "gpus": 2, "ttft_p99_s": ttft, "tpot_p99_s": tpot}

    rows = {"colocated": row(0, 0.2, 0.010), "split": row(1, 0.3, 0.020)}
    assert disagg.verdict(rows)[-1].startswith("colocated wins on TPOT P99 among the candidates; the closest split, "
                                               "disaggregation (1 prefill + 1 decode), has TPOT P99 2.0x higher")
    rows["split"] = row(1, 0.3, 0.0099)
    assert disagg.verdict(rows)[-1].startswith("no clear winner on TPOT P99 (within 5%)")
    rows["split"] = row(1, 5.0, 0.005)  # a starved decode pool: low TPOT, TTFT far over the 1 s target
    notes = disagg.verdict(rows)
    assert "over the 1 s target: not a candidate" in notes[0] and notes[-1].startswith("colocated wins")


def test_requests_are_cut_to_the_context_window():
    reqs = disagg.workload(300, 8.0, 0, 4096, 128, 8192)
    assert max(r.prompt_len + r.output_len for r in reqs) <= 8192
    assert max(r.prompt_len for r in reqs) > 4096  # the tail is still there, only cut


@pytest.mark.parametrize("args, words", [
    (("--gpus", 1), "--gpus must be an integer >= 2"),
    (("--gpus", 4, "--prefill-gpus", 4), "--prefill-gpus must be in [1, 3] for --gpus 4, got 4"),
    (("--gpus", 6, "--prefill-gpus", 2, 0), "--prefill-gpus must be in [1, 5] for --gpus 6, got 0"),
    (("--rate", 0), "--rate must be a number > 0"),
    (("--link-gbps", "nan"), "--link-gbps must be a number > 0"),
    (("--requests", 0), "--requests must be >= 1"),
    (("--seeds", "two"), "argument --seeds: invalid int value: 'two'"),
    (("--gpu", "B200"), "--gpu 'B200' is not a known GPU"),
    (("--model", "llama3-70b"), "--model llama3-70b: its weights do not fit in one H100 SXM"),
])
def test_bad_cli_arguments_exit_2_with_one_line_naming_the_option(capsys, args, words):
    code, out, err = cli(capsys, *args)
    assert code == 2 and not out
    assert err.startswith("python -m miniengine disagg: error: ") and words in err, err
    assert len(err.strip().splitlines()) == 1, err
