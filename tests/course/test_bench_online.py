"""``bench online`` end to end on a tiny trace: it starts a server, measures both ways, and checks the text agrees.
Its numbers are measurements, not assertions (a benchmark, not a timed test)."""
import re

import pytest

from miniengine.course.cli import main


@pytest.mark.slow
def test_bench_online_prints_both_rows_per_rate_and_its_last_line(capsys, tmp_path):
    plot = tmp_path / "online.png"
    assert main(["bench", "online", "--rates", "32", "64", "--requests", "6", "--batch-one", "2", "--mean-new-tokens",
                 "8", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sum(line.split()[1:2] == ["online"] for line in out) == 2
    assert sum(line.split()[1:2] == ["in-process"] for line in out) == 2
    assert "same text online and in-process: True" in out and plot.stat().st_size > 0
    assert re.fullmatch(r"batch 1 \(2 requests one at a time\): TPOT P50 online [\d.]+ ms, in-process [\d.]+ ms: "
                        r"[\d.]+x", next(line for line in out if line.startswith("batch 1")))
    assert re.fullmatch(r"online/in-process goodput at the highest rate meeting the SLO: ([\d.]+x|none.*)", out[-1])
