"""Lab 10's tests (the capstone: your engine behind the OpenAI-compatible server): what each test cell checks.

Every verdict is reached outside your code: the tests start ``python -m miniengine serve`` in a process of its own (on
127.0.0.1; in the grading sandbox too, which has a loopback network and nothing else) and talk to it over HTTP.
Every check observes what it found (checks.observe: the fields the server read, tokens, texts, rates); the grader
compares that with the answer sheet outside your notebook. Hidden cells hold their cases' inputs only: the tokens and
texts they report go to the grader, which compares them with the hidden golden files (autograder/hidden_outputs.py).

Task 1, serve_flags (flags-visible/-hidden, lab10/flags.py): each configuration's flags, parsed by the server's own
  parser, must read back as the configuration, every other field at its default; an unknown field is a ValueError
  that names it.
Task 2, stream_completion (stream-visible/-hidden, lab10/serving.py): your client streams each case from the server;
  its text, token ids and finish reason must be the golden ones and the server's own non-streamed answer (joined
  chunks equal the non-streamed text), on stop strings (one ending inside a token) and penalties too.
Task 3, your engine served (served-visible/-hidden, lab10/serving.py): the server started with your flags and your
  saved parts of labs 01-09 (lab10/served.py: outside grading from mine/, under grading from the mine/ handed in with
  the notebook) serves every golden case at once to the harness's own client: tokens, text, finish reason and usage.
Task 4, process_row and StopRules (features-visible/-hidden, lab10/features.py): your penalties and min_p on seeded
  random rows, your find_stop and sendable on fixed texts (against the course's own: miniengine/logits_processors.py,
  miniengine/stop_strings.py, this task's ANSWER_KEY, which is forbidden while yours run); then both served
  (--logits-processor, --stop-strings) on the penalty, min_p and stop-string cases, tokens and text.
Design, serving_config (design-serving-visible/-hidden, lab10/design.py): the harness replays seeded chat traces on
  the simulator (Llama-3-8B, paper H100) with your configuration at a fixed ladder of rates; the highest rate at which
  SLO attainment is at least 90% earns full points at TARGET_RATE, none at the default configuration's, partial
  credit between.
Numbers (numbers, lab10/design.py): three figures, checked only when graded.
"""
from __future__ import annotations

import importlib

from autograder import notebook_checks as checks  # noqa: F401  (the cells reach HiddenReport through lab.checks)
from autograder.labs.lab10 import common as lab10_common, design as lab10_design, flags as lab10_flags  # noqa: E402
from autograder.labs.lab10 import features as lab10_features, served as lab10_served  # noqa: E402
from autograder.labs.lab10 import serving as lab10_serving  # noqa: E402

# `pristine` reloads this file only: its parts afresh too, each one's dependencies before it.
for _part in (lab10_common, lab10_flags, lab10_served, lab10_serving, lab10_features, lab10_design):
    importlib.reload(_part)

from autograder.labs.lab10.design import (RATES, TARGET_RATE, check_design, check_numbers,  # noqa: E402
                                          report_numbers)
from autograder.labs.lab10.features import (ANSWER_KEY, check_rows, check_served_features,  # noqa: E402
                                             check_stop_rules, report_served_features)
from autograder.labs.lab10.flags import check_flags  # noqa: E402
from autograder.labs.lab10.serving import SERVED, check_served, check_stream, report_served, report_stream  # noqa: E402

VISIBLE_GOLDEN = checks.VISIBLE_GOLDEN  # data/golden/visible.json
GOLDEN_DIR = str(checks.VISIBLE_GOLDEN).rsplit("/", 1)[0]
VISIBLE_FILES = [f"{GOLDEN_DIR}/visible.json", f"{GOLDEN_DIR}/sampling_features.json", f"{GOLDEN_DIR}/lab10_stops.json"]

FEATURE_FILES = VISIBLE_FILES[1:]  # the penalty, min_p and stop-string cases (Task 4)

__all__ = ["ANSWER_KEY", "VISIBLE_GOLDEN", "VISIBLE_FILES", "FEATURE_FILES", "RATES", "TARGET_RATE", "SERVED",
           "check_flags", "check_stream", "report_stream", "check_served", "report_served", "check_rows",
           "check_stop_rules", "check_served_features", "report_served_features", "check_design", "check_numbers",
           "report_numbers"]
