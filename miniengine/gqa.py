"""Turn a multi-head (MHA) model into a grouped-query (GQA) one: mean-pool K/V heads, then uptrain briefly.

    python -m miniengine convert-gqa --kv-heads 2            # writes data/models/target-gqa2 and its card

Ainslie et al., "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints"
(EMNLP 2023, https://arxiv.org/abs/2305.13245): query head h of a GQA model with K KV heads reads KV head
h // (H / K).  A checkpoint converts by averaging the K and V projections of each group of H / K heads
(mean pooling beat keeping one head of each group), and recovers most of the quality with about 5% of
the original training steps.  The KV cache shrinks by H / K: every token stores K heads, not H.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from . import corpus
from .model import Llama, load_model, save_model
from .paths import MODELS, TARGET
from .tokenizer import load_tokenizer, save_tokenizer
from .train import batch_at, encode_corpus, evaluate, lm_loss, lr_at, optimizer_step


def mean_pool_kv(weight: torch.Tensor, num_heads: int, kv_heads: int) -> torch.Tensor:
    """[num_heads * head_dim, hidden] K or V projection -> [kv_heads * head_dim, hidden]: each group's mean."""
    if kv_heads < 1 or num_heads % kv_heads:
        raise ValueError(f"kv_heads must divide the {num_heads} KV heads of the model, got {kv_heads}")
    head_dim = weight.shape[0] // num_heads
    groups = weight.reshape(kv_heads, num_heads // kv_heads, head_dim, weight.shape[1])
    return groups.mean(dim=1).reshape(kv_heads * head_dim, weight.shape[1])


def convert(model: Llama, kv_heads: int, pool=mean_pool_kv) -> Llama:
    """A GQA copy of an MHA model (``pool`` is the plug point: Lab 07 writes it)."""
    c = model.config
    if c.num_key_value_heads != c.num_attention_heads:
        raise ValueError(f"the model already has {c.num_key_value_heads} KV heads for {c.num_attention_heads} query "
                         f"heads: convert an MHA model")
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1 or c.num_attention_heads % kv_heads:
        raise ValueError(f"kv_heads must be a divisor of num_attention_heads={c.num_attention_heads}, got {kv_heads!r}")
    out = Llama(dataclasses.replace(c, num_key_value_heads=kv_heads)).to(device=model.device, dtype=model.dtype)
    state = copy.deepcopy(model.state_dict())
    for i in range(c.num_hidden_layers):
        for proj in ("k_proj", "v_proj"):
            key = f"model.layers.{i}.self_attn.{proj}.weight"
            state[key] = pool(state[key], c.num_attention_heads, kv_heads)
    out.load_state_dict(state, strict=True)
    return out.eval()


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
             f"--kv-heads {c.num_key_value_heads}` (`miniengine/gqa.py`).", "",
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
