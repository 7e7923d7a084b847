"""What the tests of typed-in lab literals share (tests/test_labNN_literals.py): the harness stood in for
while a test cell runs outside a kernel, and the observations a check makes."""
from miniengine.model import LlamaConfig

LLAMA3_8B = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False)


class Harness:
    """Stands in for ``lab`` when a lab 03 test cell is run here: the harness's models and GPUs, its checks recorded."""

    def __init__(self, real, calls):
        self.real, self.calls = real, calls

    def __getattr__(self, name):
        if name.startswith(("check_", "report_")):
            return lambda *args, **kwargs: self.calls.append((name, args, kwargs))
        return getattr(self.real, name)


def observed(check, *args, **kwargs) -> dict:
    """What a harness check observes, run here (without handing it out): {label: value}."""
    from autograder.notebook_checks import ledger

    del ledger._rows[:]
    getattr(check, "__wrapped__", check)(*args, **kwargs)
    rows = ledger.pending()
    del ledger._rows[:]
    assert len({r["label"] for r in rows}) == len(rows)
    return {r["label"]: r["value"] for r in rows}


def cell_calls(lab, ns: dict, source: str) -> list:
    """The harness calls a test cell's ``source`` makes, run with the solution's namespace ``ns`` (the cell's own
    inputs), its harness ``lab`` stood in for and its reload line left out: [(check name, args, kwargs)]."""
    source = "".join(ln for ln in source.splitlines(True) if "importlib" not in ln)
    calls: list = []
    exec(source, dict(ns, lab=Harness(lab, calls)))
    return calls
