"""The scan test_regress.py runs over the executed lectures finds a graded number however it is printed, and only
where it is printed."""
from graded_numbers import answers_shown, spellings


def notebook(text: str, markdown: str = "") -> dict:
    return {"cells": [{"cell_type": "markdown", "source": [markdown]},
                      {"cell_type": "code", "source": [], "outputs": [{"output_type": "stream", "text": [text]}]}]}


def test_a_number_is_found_with_or_without_separators_and_rounded():
    numbers = {"lab01 kv": 12288, "lab03 limit": 115.71196878239132}
    assert answers_shown(notebook("KV: 12,288 bytes per token"), numbers) == ["lab01 kv (12,288)"]
    assert answers_shown(notebook("", "it approaches 115.7 FLOP/byte"), numbers) == ["lab03 limit (115.7)"]
    assert answers_shown(notebook("12288 bytes"), numbers) == ["lab01 kv (12288)"]


def test_a_longer_number_or_a_round_ratio_is_not_a_match():
    numbers = {"lab01 kv": 12288, "lab03 ratio": 1.000033793316381, "lab06 gamma": 3}
    assert answers_shown(notebook("122,880 and 12,288.5 and 1.00x and 3 steps"), numbers) == []
    assert spellings(1.000033793316381) == set() and spellings(3) == set()
