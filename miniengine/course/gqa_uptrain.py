"""``python -m miniengine convert-gqa``: convert the MHA target to GQA, then uptrain it briefly and write its card.

    python -m miniengine convert-gqa --kv-heads 2            # writes data/models/target-gqa2 and its card

Ainslie et al., "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints"
(EMNLP 2023, https://arxiv.org/abs/2305.13245): a checkpoint converted by mean pooling recovers most of its
quality with about 5% of the original training steps.  The conversion itself is :mod:`miniengine.gqa`.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

from miniengine.course import corpus
from miniengine.course.train import batch_at, encode_corpus, evaluate, lm_loss, lr_at, optimizer_step
from miniengine.gqa import convert
from miniengine.model import Llama, load_model, save_model
from miniengine.paths import MODELS, TARGET
from miniengine.tokenizer import load_tokenizer, save_tokenizer


def uptrain(model: Llama, steps: int, out: Path, seed: int = 0, batch: int = 16, seq_len: int = 256, lr: float = 1e-3,
            warmup: int = 5) -> dict:
    """``steps`` of ordinary training (the target's recipe, a lower learning rate); returns the log."""
    tok = load_tokenizer(TARGET)
    train_files, val_files = corpus.split_files()
    train_ids, val_ids = encode_corpus(tok, train_files), encode_corpus(tok, val_files)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    log = {"step": [], "train_loss": [], "val_step": [], "val_loss": []}
    t0 = time.time()
    for step in tqdm(range(steps), desc="uptrain", unit="step"):
        # Batches the target never saw at these steps: a seed of their own.
        x, y = batch_at(train_ids, seed + 1, step, batch, seq_len)
        loss = lm_loss(model, x, y)
        optimizer_step(model, opt, loss, lr_at(step, steps, lr, warmup))
        log["step"].append(step)
        log["train_loss"].append(loss.item())
    model.eval()
    log["val_step"].append(steps)
    log["val_loss"].append(evaluate(model, val_ids, seq_len))
    log["seconds"] = time.time() - t0
    log["tokens_seen"] = steps * batch * seq_len
    log["train_files"], log["val_files"] = len(train_files), len(val_files)
    log["config"] = {"seed": seed + 1, "steps": steps, "batch": batch, "seq_len": seq_len, "lr": lr, "warmup": warmup}
    return log


def run(args) -> int:
    target_dir = Path(args.target)
    base = load_model(target_dir)
    tok = load_tokenizer(target_dir)
    out = Path(args.out) if args.out else MODELS / f"{target_dir.name}-gqa{args.kv_heads}"
    val_ids = encode_corpus(tok, corpus.split_files()[1])
    target_log = json.loads((target_dir / "training_log.json").read_text())
    steps = args.steps or max(1, round(0.05 * target_log["config"]["steps"]))  # Ainslie et al.: about 5%
    model = convert(base, args.kv_heads)
    losses = {"MHA target": evaluate(base, val_ids, 256), "converted (mean-pooled)": evaluate(model, val_ids, 256)}
    log = uptrain(model, steps, out, seed=args.seed)
    losses[f"uptrained ({steps} steps)"] = log["val_loss"][-1]
    log["gqa"] = {"from": target_dir.name, "kv_heads": args.kv_heads, "val_loss": losses,
                  "kv_bytes_per_token": {"MHA target": base.config.kv_bytes_per_token(4),
                                         "GQA": model.config.kv_bytes_per_token(4)}}
    save_model(model, out)
    save_tokenizer(tok, out)
    (out / "training_log.json").write_text(json.dumps(log) + "\n")
    write_gqa_card(out, base, model, log)
    for name, loss in losses.items():
        print(f"{name:<28} validation loss {loss:.4f} (perplexity {math.exp(loss):.2f})")
    print(f"KV bytes per token: {base.config.kv_bytes_per_token(4):,} (MHA) -> {model.config.kv_bytes_per_token(4):,} "
          f"(GQA, {args.kv_heads} KV heads); wrote {out}")
    return 0


def write_gqa_card(out: Path, base: Llama, model: Llama, log: dict) -> str:
    g, c = log["gqa"], model.config
    lines = [f"# Model card: `{out.name}`", "",
             f"`{g['from']}` converted from multi-head to grouped-query attention: {c.num_attention_heads} query heads "
             f"share {c.num_key_value_heads} KV heads (groups of {c.num_attention_heads // c.num_key_value_heads}). "
             "Each group's K and V projections are the mean of the original heads' (Ainslie et al., 2023), then "
             f"the model is trained {log['config']['steps']} more steps ({log['tokens_seen']:,} tokens, "
             f"{log['seconds'] / 60:.1f} min on a 2-core CPU). Written by `python -m miniengine convert-gqa "
             f"--kv-heads {c.num_key_value_heads}` (`miniengine/course/gqa_uptrain.py`).", "",
             "| model | validation loss | perplexity | KV bytes per token (float32) |", "|---|---|---|---|"]
    for name, loss in g["val_loss"].items():
        kv = g["kv_bytes_per_token"]["MHA target" if name == "MHA target" else "GQA"]
        lines.append(f"| {name} | {loss:.4f} | {math.exp(loss):.2f} | {kv:,} |")
    lines += ["", f"Parameters: {model.num_parameters():,} (the MHA target: {base.num_parameters():,}).", ""]
    text = "\n".join(lines)
    (out / "README.md").write_text(text)
    return text


def add_arguments(p) -> None:
    p.add_argument("--kv-heads", type=int, required=True, help="KV heads of the GQA model (a divisor of the query heads)")
    p.add_argument("--target", default=str(TARGET), help="the MHA model to convert")
    p.add_argument("--out", help="model directory to write (default: data/models/<target>-gqa<K>)")
    p.add_argument("--steps", type=int, default=0, help="uptraining steps (default: 5%% of the target's)")
    p.add_argument("--seed", type=int, default=0)
