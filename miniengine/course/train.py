"""Train a tiny Llama on the Python standard library, on the CPU, with a fixed seed.

    python -m miniengine train --out data/models/target --hidden-size 256 --layers 6 --steps 3000
    python -m miniengine train --out data/models/draft-distilled --distill-from data/models/target \
        --tokenizer data/models/target --hidden-size 96 --intermediate-size 256 --layers 2 --heads 3 --steps 1500

With ``--distill-from`` the model learns the teacher's whole next-token distribution instead of the
one token the corpus has: the loss is KL(teacher || student) over the vocabulary at every position
(Hinton et al., "Distilling the Knowledge in a Neural Network", 2015), on the same batches.  A draft
for speculative decoding is judged by how often it agrees with its target, which is what this trains.

Batches are random windows of the training token stream, drawn from a generator
seeded by (seed, step), so a resumed run sees exactly the batches an
uninterrupted run would have.  A checkpoint (weights, optimizer, step, losses)
is written every ``--ckpt-every`` steps; ``--resume`` continues from it.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from miniengine.course import corpus
from miniengine.attention import NoCacheBackend
from miniengine.model import Llama, LlamaConfig, save_model
from miniengine.tokenizer import eos_id, load_tokenizer, save_tokenizer, train_tokenizer


def encode_corpus(tok, paths) -> np.ndarray:
    """All files, each followed by <|endoftext|>, as one uint16 stream."""
    eos = eos_id(tok)
    ids = []
    for enc in tok.encode_batch(corpus.read_texts(paths)):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def batch_at(stream: np.ndarray, seed: int, step: int, batch: int, seq_len: int):
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(stream) - seq_len - 1, size=batch)
    x = np.stack([stream[s : s + seq_len + 1] for s in starts]).astype(np.int64)
    return torch.from_numpy(x[:, :-1]), torch.from_numpy(x[:, 1:])


def distill_loss(model: Llama, teacher: Llama, x: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per position, averaged: the teacher's full distribution is the label."""
    B, T = x.shape
    positions = torch.arange(T, device=x.device).repeat(B)
    with torch.no_grad():
        target = torch.log_softmax(teacher(x.reshape(-1), positions, NoCacheBackend([T] * B)), dim=-1)
    student = torch.log_softmax(model(x.reshape(-1), positions, NoCacheBackend([T] * B)), dim=-1)
    return torch.nn.functional.kl_div(student, target, log_target=True, reduction="batchmean")


def lm_loss(model: Llama, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of next-token prediction, through the same seam inference uses."""
    B, T = x.shape
    positions = torch.arange(T, device=x.device).repeat(B)
    logits = model(x.reshape(-1), positions, NoCacheBackend([T] * B))
    return torch.nn.functional.cross_entropy(logits, y.reshape(-1))


@torch.no_grad()
def evaluate(model: Llama, stream: np.ndarray, seq_len: int, n_windows: int = 32) -> float:
    """Mean loss over fixed, evenly spaced windows of the validation stream (the model's mode is restored)."""
    was_training = model.training
    model.eval()
    starts = np.linspace(0, len(stream) - seq_len - 1, n_windows).astype(np.int64)
    losses = []
    for s in starts:
        x = torch.from_numpy(stream[s : s + seq_len + 1].astype(np.int64)).to(model.device)
        losses.append(lm_loss(model, x[None, :-1], x[None, 1:]).item())
    model.train(was_training)
    return float(np.mean(losses))


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))  # cosine down to 10%


def optimizer_step(model, opt, loss: torch.Tensor, lr: float) -> None:
    """One AdamW update at learning rate ``lr``, gradients clipped to norm 1."""
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def train(args) -> Path:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)

    train_files, val_files = corpus.split_files()
    tok_dir = Path(args.tokenizer) if args.tokenizer else out
    if not (tok_dir / "tokenizer.json").exists():
        print(f"training a {args.vocab_size}-token byte-level BPE on {len(train_files)} files ...")
        save_tokenizer(train_tokenizer(corpus.read_texts(train_files), args.vocab_size), tok_dir)
    tok = load_tokenizer(tok_dir)
    if tok_dir != out:
        save_tokenizer(tok, out)
    train_ids, val_ids = encode_corpus(tok, train_files), encode_corpus(tok, val_files)
    print(f"corpus: {len(train_files)} train files ({len(train_ids):,} tokens), "
          f"{len(val_files)} validation files ({len(val_ids):,} tokens)")

    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads or args.heads,
        max_position_embeddings=args.max_position, bos_token_id=eos_id(tok), eos_token_id=eos_id(tok),
    )
    model = Llama(cfg)
    with torch.no_grad():  # small init, as GPT-2/Llama do; residual projections scaled by depth
        for name, p in model.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * cfg.num_hidden_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                torch.nn.init.normal_(p, std=std)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    teacher = None
    if args.distill_from:
        from miniengine.model import load_model
        teacher = load_model(args.distill_from)
        if teacher.config.vocab_size != cfg.vocab_size:
            raise ValueError(f"--distill-from: the teacher's vocabulary ({teacher.config.vocab_size}) must be the "
                             f"student's ({cfg.vocab_size}): pass --tokenizer {args.distill_from}")

    ckpt_path = out / "checkpoint.pt"
    log = {"step": [], "train_loss": [], "val_step": [], "val_loss": [], "seconds": 0.0}
    start_step = 0
    if args.resume and ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start_step, log = ckpt["step"], ckpt["log"]
        print(f"resumed at step {start_step}")

    def save_ckpt(step):
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "log": log}, ckpt_path)

    model.train()
    t0 = time.time() - log["seconds"]
    bar = tqdm(range(start_step, args.steps), initial=start_step, total=args.steps, desc="train", unit="step")
    for step in bar:
        x, y = batch_at(train_ids, args.seed, step, args.batch, args.seq_len)
        loss = lm_loss(model, x, y) if teacher is None else distill_loss(model, teacher, x)
        optimizer_step(model, opt, loss, lr_at(step, args.steps, args.lr, args.warmup))
        log["step"].append(step)
        log["train_loss"].append(loss.item())
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            log["val_step"].append(step + 1)
            log["val_loss"].append(evaluate(model, val_ids, args.seq_len))
            bar.set_postfix(loss=f"{loss.item():.3f}", val=f"{log['val_loss'][-1]:.3f}")
        log["seconds"] = time.time() - t0
        if (step + 1) % args.ckpt_every == 0:
            save_ckpt(step + 1)
    save_ckpt(args.steps)

    log["tokens_seen"] = args.steps * args.batch * args.seq_len
    log["train_files"], log["val_files"] = len(train_files), len(val_files)
    log["config"] = {k: getattr(args, k) for k in ("seed", "steps", "batch", "seq_len", "lr", "warmup")}
    if args.distill_from:
        log["config"]["distilled_from"] = Path(args.distill_from).name
    (out / "training_log.json").write_text(json.dumps(log) + "\n")
    save_model(model, out)
    print(f"saved {model.num_parameters():,} parameters to {out} after {log['seconds'] / 60:.1f} min; "
          f"final validation loss {log['val_loss'][-1]:.3f}")
    return out


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--tokenizer", help="directory with an existing tokenizer.json to reuse (the draft shares the target's)")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--intermediate-size", type=int, default=704)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=0, help="0 means MHA (as many KV heads as query heads)")
    p.add_argument("--max-position", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--ckpt-every", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--distill-from", help="a teacher model directory: train on KL to its logits instead of the next token")
