"""A byte-level BPE tokenizer, trained with Hugging Face ``tokenizers`` and saved as tokenizer.json.

Byte-level means every string round-trips: unknown characters fall back to
their UTF-8 bytes, so there is no <unk>.  One special token, ``<|endoftext|>``,
separates documents in training and ends a generation.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS_TOKEN = "<|endoftext|>"


def train_tokenizer(texts, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],  # id 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def save_tokenizer(tok: Tokenizer, directory: str | Path) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    # Lets transformers' AutoTokenizer / PreTrainedTokenizerFast pick the file up unchanged.
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "bos_token": EOS_TOKEN,
        "model_max_length": json.loads((directory / "config.json").read_text())["max_position_embeddings"]
        if (directory / "config.json").exists()
        else 512,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_tokenizer(directory: str | Path) -> Tokenizer:
    path = Path(directory) / "tokenizer.json"
    if not path.exists():
        raise FileNotFoundError(f"no tokenizer at {path}")
    return Tokenizer.from_file(str(path))


def eos_id(tok: Tokenizer) -> int:
    return tok.token_to_id(EOS_TOKEN)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas, for streaming.

    One character can span several byte-level tokens, so a delta is held back
    while the decoded tail ends in an incomplete character (U+FFFD).
    """

    def __init__(self, tok: Tokenizer):
        self.tok, self.ids, self.text = tok, [], ""

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        delta, self.text = text[len(self.text):], text
        return delta
