"""What speculative decoding should give, from the acceptance rate alone (Leviathan et al., 2023, section 3).

If each drafted token is accepted with probability α, independently, a step that drafts γ tokens emits

    E[tokens per target call] = (1 − α^(γ+1)) / (1 − α)

(the accepted run, geometric and cut at γ, plus the target's own token).  The wall-clock gain is that
many tokens for the price of γ draft steps and one target pass over γ + 1 tokens, against one target
step per token.
"""
from __future__ import annotations


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def speedup(alpha: float, gamma: int, target_step_s: float, target_verify_s: float, draft_step_s: float) -> float:
    """Plain decoding's time per token over speculative decoding's: target_step_s is one plain decode step,
    target_verify_s one pass over γ + 1 tokens, draft_step_s one draft decode step."""
    return expected_tokens_per_call(alpha, gamma) * target_step_s / (gamma * draft_step_s + target_verify_s)


def paper_gpu_speedup(alpha: float, gamma: int, target_cfg, draft_cfg, gpu, context: int = 1024) -> float:
    """The cost model's speedup at batch 1: both models' steps priced on the paper GPU (the verify pass needs
    logits at all γ + 1 positions).  Memory capacity is not checked: Llama-3-70B's 141 GB of bf16 weights need
    several GPUs, which shrink both sides' step times alike."""
    from miniengine.cost.roofline import CostModel

    target, draft = CostModel(target_cfg, gpu), CostModel(draft_cfg, gpu)
    return speedup(alpha, gamma, target.forward([1], [context]).step_time_s,
                   target.forward([gamma + 1], [context], logits="all").step_time_s,
                   draft.forward([1], [context]).step_time_s)
