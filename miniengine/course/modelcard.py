"""Model cards: what a shipped model is, how it was trained, and how well it writes Python.

    python -m miniengine card --model data/models/target
    python -m miniengine card --model data/models/draft --target data/models/target

Writes README.md and loss.png into the model directory.  Every number in the
card is measured here, from the weights and the training log.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import torch

from miniengine.course import corpus
from miniengine.attention import NoCacheBackend
from miniengine.model import load_model
from miniengine.reference import naive_generate
from miniengine.sampling import SamplingParams
from miniengine.tokenizer import load_tokenizer
from miniengine.course.train import encode_corpus

SAMPLE_PROMPTS = [
    "def fibonacci(n):",
    "class Point:\n    def __init__(self, x, y):",
    "import os\n\n\ndef walk(top):",
    "    for line in lines:",
    "def main():\n    parser = argparse.ArgumentParser(",
    "try:\n    import threading\nexcept ImportError:",
]
# 20 function headers for the parse-rate measurement: does the completed function parse?
FUNCTION_HEADERS = [
    "def add(a, b):", "def is_even(n):", "def reverse(s):", "def mean(values):", "def read_lines(path):",
    "def clamp(x, lo, hi):", "def flatten(items):", "def count_words(text):", "def get_name(self):",
    "def close(self):", "def __len__(self):", "def __eq__(self, other):", "def join_path(*parts):",
    "def parse_int(s, default=None):", "def unique(seq):", "def chunks(data, size):", "def encode(self, text):",
    "def _check_arg(value):", "def write_file(path, data):", "def find_first(pred, items):",
]


def function_source(header: str, completion: str, truncated: bool) -> str | None:
    """The header plus its body: lines up to the first non-blank line back at column 0.

    None when there is no body line at all (a function without a body is not a completion).
    """
    first, *rest = (header + completion).split("\n")
    body = []
    for line in rest:
        if line.strip() and not line.startswith((" ", "\t")):
            truncated = False  # the function ended on its own
            break
        body.append(line)
    if truncated and body:
        body.pop()  # the last line may have been cut mid-way by max_tokens
    if not any(line.strip() for line in body):
        return None
    return "\n".join([first, *body]).rstrip() + "\n"


def parses(source: str | None) -> bool:
    if source is None:
        return False
    try:
        ast.parse(source)
        return True
    except SyntaxError:
        return False


def parse_rate(model, tok, max_tokens: int = 96) -> tuple[float, list[tuple[str, bool]]]:
    prompts = [tok.encode(h).ids for h in FUNCTION_HEADERS]
    outs = naive_generate(model, prompts, SamplingParams(temperature=0, max_tokens=max_tokens), dtype=torch.float32)
    results = []
    for header, c in zip(FUNCTION_HEADERS, outs):
        src = function_source(header, tok.decode(c.token_ids), c.finish_reason == "length")
        results.append((src, parses(src)))
    return sum(ok for _, ok in results) / len(results), results


@torch.no_grad()
def top1_agreement(draft, target, tok, n_windows: int = 32, seq_len: int = 256) -> float:
    """Share of validation positions where the draft's argmax equals the target's."""
    _, val_files = corpus.split_files()
    stream = encode_corpus(tok, val_files)
    starts = np.linspace(0, len(stream) - seq_len - 1, n_windows).astype(np.int64)
    agree = total = 0
    for s in starts:
        ids = torch.from_numpy(stream[s : s + seq_len].astype(np.int64))
        pos = torch.arange(seq_len)
        a = draft(ids.to(draft.device), pos.to(draft.device), NoCacheBackend([seq_len])).argmax(-1).cpu()
        b = target(ids.to(target.device), pos.to(target.device), NoCacheBackend([seq_len])).argmax(-1).cpu()
        agree += int((a == b).sum())
        total += seq_len
    return agree / total


def plot_losses(log: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, train = np.asarray(log["step"]), np.asarray(log["train_loss"])
    k = max(1, min(25, len(train) // 4))  # moving average: single-batch losses are noisy
    smooth = np.convolve(train, np.ones(k) / k, mode="valid")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, train, color="tab:blue", alpha=0.25, lw=0.8)
    ax.plot(steps[k - 1 :], smooth, color="tab:blue", label=f"train (moving average of {k})")
    ax.plot(log["val_step"], log["val_loss"], "o-", color="tab:orange", ms=3, label="validation")
    ax.set(xlabel="step", ylabel="cross-entropy (nats/token)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "↵").replace("`", "'")


def write_card(model_dir: Path, target_dir: Path | None = None) -> str:
    model_dir = Path(model_dir)
    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    log = json.loads((model_dir / "training_log.json").read_text())
    c = model.config
    plot_losses(log, model_dir / "loss.png", f"{model_dir.name}: {model.num_parameters():,} parameters")

    samples = naive_generate(model, [tok.encode(p).ids for p in SAMPLE_PROMPTS],
                             SamplingParams(temperature=0, max_tokens=48), dtype=torch.float32)
    rate, results = parse_rate(model, tok)
    tail = 10  # average the last train losses: one batch is noisy
    teacher = log["config"].get("distilled_from")
    lines = [
        f"# Model card: `{model_dir.name}`",
        "",
        "A tiny Llama trained by this project on the Python standard library's own source "
        "(`python -m miniengine train`; see `miniengine/course/train.py`)"
        + (f", distilled from `{teacher}`: its loss is the KL divergence from the teacher's next-token distribution "
           f"at every position (`--distill-from`), not the corpus's next token" if teacher else "")
        + ". Weights are fp32 safetensors in the Hugging Face Llama layout; `transformers` loads them as "
        "`LlamaForCausalLM`.",
        "",
        "| | |",
        "|---|---|",
        f"| parameters | {model.num_parameters():,} |",
        f"| architecture | {c.num_hidden_layers} layers, hidden {c.hidden_size}, MLP {c.intermediate_size}, "
        f"{c.num_attention_heads} query heads / {c.num_key_value_heads} KV heads (head_dim {c.head_dim}), "
        f"tied embeddings: {c.tie_word_embeddings} |",
        f"| vocabulary | {c.vocab_size} (byte-level BPE, `<|endoftext|>` = {c.eos_token_id}) |",
        f"| context | {c.max_position_embeddings} positions (trained on windows of {log['config']['seq_len']}) |",
        f"| corpus | {log['train_files']} train files, {log['val_files']} validation files (split by file) |",
        f"| tokens seen | {log['tokens_seen']:,} ({log['config']['steps']} steps x {log['config']['batch']} x {log['config']['seq_len']}) |",
        f"| wall time | {log['seconds'] / 60:.1f} min on a 2-core CPU |",
        f"| train loss{' (KL to the teacher)' if teacher else ''} (mean of last {tail} steps) | "
        f"{np.mean(log['train_loss'][-tail:]):.3f} |",
        f"| validation loss | {log['val_loss'][-1]:.3f} (best {min(log['val_loss']):.3f}) |",
        f"| greedy function completions that parse with `ast` | {rate:.0%} ({round(rate * len(results))}/{len(results)}) |",
    ]
    if target_dir is not None:
        target = load_model(target_dir)
        share = model.num_parameters() / target.num_parameters()
        lines.append(f"| size relative to `{Path(target_dir).name}` | {share:.1%} |")
        lines.append(f"| top-1 agreement with `{Path(target_dir).name}` on validation text | {top1_agreement(model, target, tok):.1%} |")
    lines += ["", "![loss curves](loss.png)", "", "## Sample greedy completions (48 tokens)", "",
              "| prompt | completion |", "|---|---|"]
    for p, s in zip(SAMPLE_PROMPTS, samples):
        lines.append(f"| `{md_escape(p)}` | `{md_escape(tok.decode(s.token_ids))}` |")
    lines += ["", "## Parse check", "",
              "Each header is completed greedily (96 tokens); the function is cut where its body ends "
              "(the first line back at column 0), and a last line cut off by the token limit is dropped. "
              "Then `ast.parse` decides.", "", "| header | parses |", "|---|---|"]
    for h, (_, ok) in zip(FUNCTION_HEADERS, results):
        lines.append(f"| `{h}` | {'yes' if ok else 'no'} |")
    text = "\n".join(lines) + "\n"
    (model_dir / "README.md").write_text(text)
    return text


def run(args) -> int:
    print(write_card(Path(args.model), Path(args.target) if args.target else None))
    return 0


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="model directory to describe")
    p.add_argument("--target", help="for a draft model: the target it drafts for (adds size share and top-1 agreement)")
