"""Lab 03's hidden tests of Tasks 1 to 4, exactly: each case's inputs only, the right figures stay with the grader.

Part of the lab03 harness (autograder/labs/lab03/__init__.py reloads it). A case may still carry its figure as a last field
(an instructor's own run), which is then checked here too.
"""
from __future__ import annotations

import autograder.notebook_checks as checks
from autograder.labs.lab03.common import close, graded, num, observe


def check_param_count_exact(param_count, cases):
    """cases: (model, config), exactly; the right counts stay with the grader (a case may still carry its count
    as a third field, then checked here too)."""
    with graded("param_count", param_count=param_count):
        for name, cfg, *want in cases:
            got = checks.as_count(param_count(cfg), f"hidden case {name}: param_count")
            observe(f"hidden case {name}: param_count", got)
            if want:
                assert got == want[0], (f"hidden case {name}: param_count should be {want[0]:,}, got {got:,} "
                                        f"(off by {got - want[0]:+,})")


def check_kv_bytes_exact(kv_bytes_per_token, cases):
    """cases: (model, config, bytes_per_value), each within 1e-9 of the right bytes, which stay with the grader (or
    checked here too where a case carries them as a fourth field)."""
    with graded("kv_bytes_per_token", kv_bytes_per_token=kv_bytes_per_token):
        for name, cfg, bpv, *want in cases:
            got = num(kv_bytes_per_token(cfg, bytes_per_value=bpv), f"hidden case {name}: kv_bytes_per_token")
            observe(f"hidden case {name}: kv_bytes_per_token", got, rel=1e-9)
            if want:
                assert close(got, want[0], 1e-9), (f"hidden case {name}: kv_bytes_per_token should be {want[0]:,}, "
                                                   f"got {got:,}")


def check_flops_exact(forward_flops, cases):
    """cases: (what, config, new_tokens, context, logits), each within 1e-6 of the right FLOPs, which stay with the
    grader (or checked here too where a case carries them as a sixth field)."""
    with graded("forward_flops", forward_flops=forward_flops):
        for name, cfg, new, ctx, logits, *want in cases:
            got = num(forward_flops(cfg, new, ctx, logits=logits), f"hidden case {name}: forward_flops")
            observe(f"hidden case {name}: forward_flops", got, rel=1e-6)
            if want:
                assert close(got, want[0], 1e-6), (f"hidden case {name}: expected {want[0]:.6g} FLOPs, got {got:.6g} "
                                                   f"(ratio {got / want[0]:.5f})")


def check_bytes_exact(forward_bytes, cases):
    """cases: (what, config, new_tokens, context, bytes_per_param, bytes_per_value), each within 1e-6 of the right
    bytes, which stay with the grader (or checked here too where a case carries them as a seventh field)."""
    with graded("forward_bytes", forward_bytes=forward_bytes):
        for name, cfg, new, ctx, bpp, bpv, *want in cases:
            got = num(forward_bytes(cfg, new, ctx, bytes_per_param=bpp, bytes_per_value=bpv),
                      f"hidden case {name}: forward_bytes")
            observe(f"hidden case {name}: forward_bytes", got, rel=1e-6)
            if want:
                assert close(got, want[0], 1e-6), (f"hidden case {name}: expected {want[0]:,.0f} bytes, got "
                                                   f"{got:,.0f} (off by {got - want[0]:+,.0f})")
