"""Training is seeded and resumable: an interrupted run continues exactly as an uninterrupted one."""
import argparse

import pytest
import torch
from safetensors.torch import load_file

from miniengine.course import corpus, train
from miniengine.paths import TARGET

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


def args_for(out, steps, resume=False):
    p = argparse.ArgumentParser()
    train.add_arguments(p)
    return p.parse_args(["--out", str(out), "--tokenizer", str(TARGET), "--hidden-size", "32", "--layers", "1",
                         "--heads", "2", "--intermediate-size", "32", "--seq-len", "32", "--batch", "2",
                         "--steps", str(steps), "--warmup", "10", "--eval-every", "2", "--ckpt-every", "2",
                         "--threads", "1"] + (["--resume"] if resume else []))


def test_resume_matches_an_uninterrupted_run(tmp_path, monkeypatch):
    # Every run tokenizes its corpus afresh, as a real resumed run does; on the first 20 training and 5 validation
    # files of the split rather than all 651 (8.8 s of CPU each time, three times). Resuming is exact on any corpus.
    train_files, val_files = corpus.split_files()
    monkeypatch.setattr(corpus, "split_files", lambda root=None: (train_files[:20], val_files[:5]))
    train.train(args_for(tmp_path / "straight", 4))
    train.train(args_for(tmp_path / "split", 2))  # stops (and checkpoints) at step 2 ...
    train.train(args_for(tmp_path / "split", 4, resume=True))  # ... and continues to step 4
    a = load_file(str(tmp_path / "straight" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert (tmp_path / "split" / "tokenizer.json").exists()


def test_distill_loss_is_zero_against_itself_and_positive_otherwise():
    import torch

    from miniengine.course.train import distill_loss
    from miniengine.model import load_model
    from miniengine.paths import DRAFT, TARGET
    target, draft = load_model(TARGET), load_model(DRAFT)
    x = torch.randint(1, 4096, (2, 16))
    assert abs(distill_loss(target, target, x).item()) < 1e-5
    assert distill_loss(draft, target, x).item() > 0.1
