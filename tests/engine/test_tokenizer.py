import pytest

from miniengine.course import corpus
from miniengine.tokenizer import EOS_TOKEN

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


@pytest.mark.parametrize("text", ["def f(x):\n    return x ** 2\n", "naïve café — 日本語 🐍", "\t\t\n\n  x", ""])
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text).ids) == text


def test_round_trip_on_validation_source(tok):
    _, val = corpus.split_files()
    text = val[0].read_text()
    assert tok.decode(tok.encode(text).ids) == text


def test_end_of_text_is_one_special_token(tok, target):
    ids = tok.encode(EOS_TOKEN).ids
    assert ids == [target.config.eos_token_id]
    assert tok.get_vocab_size() == target.config.vocab_size


def test_corpus_split_is_by_file_and_deterministic():
    train, val = corpus.split_files()
    assert train == sorted(train, key=lambda p: p.relative_to(corpus.stdlib_root()).as_posix())
    assert not set(train) & set(val) and len(val) > 0.05 * len(train)
    assert not any("test" in p.relative_to(corpus.stdlib_root()).parts for p in train + val)
