import json

import pytest
import torch

from miniengine.model import Llama, LlamaConfig, load_model
from miniengine.paths import GOLDEN, REPO_ROOT, TARGET
from miniengine.tokenizer import load_tokenizer

# Tests share two cores with whatever else runs; one thread keeps timings steady.
torch.set_num_threads(1)


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
    return json.loads((REPO_ROOT / "autograder" / "hidden" / "golden.json").read_text())


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
