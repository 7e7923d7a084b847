"""Lab 07, Task 3: mean_pool_kv, checked against the lab's pooling written out as a formula, in gqa.convert of the
real target, and on a target whose heads already share K and V. Reloaded by ``autograder.labs.lab07``.

Besides its assertions, each check ``observe``s what it measured (autograder/notebook_checks/ledger.py), for the grader to judge
outside the notebook: your pooled weights and their dtype (the formula's as the expected values in a visible case; the
course's solution's, with the grader, in a hidden one), the converted model's KV heads and how many of its projections
are not the group means, how far the logits of the shared-heads model moved, and that bad kv_heads raised."""
from __future__ import annotations

import numpy as np
import torch

import autograder.notebook_checks as checks
from autograder.labs.lab07.common import ANSWER_KEY, as_tensor, call, first, head_rows, want_pool
from miniengine.attention import NoCacheBackend
from miniengine.gqa import convert


def pool_problem(got, w, H, K, rtol, atol):
    """What a wrong pooling did instead, in words (or nothing)."""
    heads, G = head_rows(w, H), H // K
    wrong = {
        "first": (np.concatenate([heads[g * G] for g in range(K)]),
                  "your KV head g is query head g*G alone, the first of its group, not the mean of the group's heads "
                  "(Ainslie et al. found mean pooling better than keeping one head)"),
        "interleaved": (np.concatenate([heads[g::K].mean(axis=0) for g in range(K)]),
                        f"your KV head g averages heads g, g+{K}, g+{2 * K}, ... (interleaved), but query head h reads "
                        f"KV head h // G, so group g is the consecutive heads g*G .. g*G+G-1"),
        "sum": (np.concatenate([heads[g * G:(g + 1) * G].sum(axis=0) for g in range(K)]),
                "your KV head g is the sum of its group's heads; take their mean"),
        "all": (np.concatenate([heads.mean(axis=0)] * K),
                "every one of your KV heads is the mean of all the heads; each group has its own mean"),
    }
    for name, (candidate, why) in wrong.items():
        if candidate.shape == got.shape and np.allclose(got, candidate, rtol=rtol, atol=atol):
            return why
    return ""


def check_pool(mean_pool_kv, w, H, K, label, hidden=False, case=""):
    """mean_pool_kv on one projection: the dtype, the shape, the group means (and what a wrong pooling did)."""
    w = torch.as_tensor(w)
    rows, hidden = w.shape
    d, G = rows // H, H // K
    what = f"{label}mean_pool_kv(weight [{rows}, {hidden}] {str(w.dtype)[6:]}, num_heads={H}, kv_heads={K})"
    before = w.clone()
    got = as_tensor(call(mean_pool_kv, what, w, H, K), what)
    assert torch.equal(w, before), f"{what}: mean_pool_kv changed the weight it was given"
    checks.observe(f"{what}{case}: the dtype", str(got.dtype), **({} if hidden else {"expect": str(w.dtype)}))
    assert got.dtype == w.dtype, f"{what}: expected the weight's dtype {w.dtype}, got {got.dtype}"
    assert tuple(got.shape) == (K * d, hidden), (
        f"{what}: expected shape [{K * d}, {hidden}] = [kv_heads * head_dim, hidden] (head_dim = {rows} / {H} = {d}), "
        f"got {list(got.shape)}")
    g = got.detach().cpu().double().numpy()
    want = want_pool(w.numpy(), H, K)
    rtol = 1e-12 if w.dtype == torch.float64 else 1e-6
    atol = rtol * float(np.abs(want).max() + 1e-30)
    # within atol + rtol * |want| (np.allclose's bound), which 2 * atol covers: atol is rtol * the largest |want|
    checks.observe(f"{what}{case}: the pooled weight", g.tolist(), tol=2 * atol, **({} if hidden else
                                                                                     {"expect": want.tolist()}))
    if not np.allclose(g, want, rtol=rtol, atol=atol):
        r, c = first(~np.isclose(g, want, rtol=rtol, atol=atol))
        kv = r // d
        why = pool_problem(g, w.numpy(), H, K, rtol, atol)
        raise AssertionError(
            f"{what}: {why + ': ' if why else ''}entry [{r}, {c}] (KV head {kv}) should be the mean of query heads "
            f"{kv * G}..{kv * G + G - 1} there, {want[r, c]:.6g}, got {g[r, c]:.6g}")


def check_bad_kv(mean_pool_kv, rows, hidden, H, K, label):
    """kv_heads that do not divide num_heads must fail with a ValueError naming kv_heads."""
    what = f"{label}mean_pool_kv(weight [{rows}, {hidden}], num_heads={H}, kv_heads={K})"
    try:
        mean_pool_kv(torch.zeros(rows, hidden), H, K)
    except ValueError as e:
        assert "kv_heads" in str(e), f"{what} raised ValueError({str(e)!r}): right, but the message should name kv_heads"
        checks.observe(f"{what} raises ValueError naming kv_heads", True, expect=True)
        return
    except Exception as e:
        raise AssertionError(f"{what} raised {type(e).__name__}: {e}; {K} KV heads cannot share {H} query heads "
                             f"evenly: raise a ValueError that names kv_heads") from e
    raise AssertionError(f"{what} returned a result, but {K} KV heads cannot share {H} query heads evenly: raise a "
                         f"ValueError")


def check_convert(mean_pool_kv, K, label, hidden=False):
    """gqa.convert(target, K, pool=mean_pool_kv): every layer's K and V projections are the group means."""
    target = checks.load_model()
    c = target.config
    H, L = c.num_attention_heads, c.num_hidden_layers
    originals = {k: v.detach().clone() for k, v in target.state_dict().items()}
    what = f"{label}gqa.convert(target, {K}, pool=mean_pool_kv)"
    gqa = call(convert, what, target, K, pool=mean_pool_kv)
    checks.observe(f"{what}: the KV heads", checks.as_count(gqa.config.num_key_value_heads, f"{what}: KV heads"),
                   **({} if hidden else {"expect": K}))
    assert gqa.config.num_key_value_heads == K, f"{what}: expected {K} KV heads, got {gqa.config.num_key_value_heads}"
    state = gqa.state_dict()
    wrong = []  # the projections that are not the group means, as (layer, proj)
    for i in range(L):
        for proj in ("k_proj", "v_proj"):
            key = f"model.layers.{i}.self_attn.{proj}.weight"
            w, got = originals[key], state[key].detach().cpu().double().numpy()
            want = want_pool(w.numpy(), H, K)
            atol = 1e-6 * float(np.abs(want).max())
            if got.shape != want.shape or not np.allclose(got, want, rtol=1e-6, atol=atol):
                wrong.append((i, proj, got, w, want, atol))
    checks.observe(f"{what}: K and V projections that are not the group means", len(wrong), at_most=0)
    if wrong:  # the first one, in words
        i, proj, got, w, want, atol = wrong[0]
        d = w.shape[0] // H
        assert got.shape == want.shape, (f"{what}: layer {i}'s {proj} has shape {list(got.shape)}, expected "
                                         f"{list(want.shape)} ({K} KV heads of {d} rows)")
        r, col = first(~np.isclose(got, want, rtol=1e-6, atol=atol))
        why = pool_problem(got, w.numpy(), H, K, 1e-6, atol)
        raise AssertionError(
            f"{what}: {why + ': ' if why else ''}layer {i}'s {proj}, entry [{r}, {col}] (KV head {r // d}) "
            f"should be the mean of the target's query heads {r // d * (H // K)}..{(r // d + 1) * (H // K) - 1} "
            f"there, {want[r, col]:.6g}, got {got[r, col]:.6g}")


@torch.no_grad()
def check_shared_heads(mean_pool_kv, K, n_tokens, seed, label):
    """If the heads of each group already share their K and V, converting must change nothing at all: query head h
    reads KV head h // G, and the mean of G equal heads is that head."""
    mha = checks.load_model(torch.float64)
    c = mha.config
    H, d = c.num_attention_heads, c.head_dim
    for layer in mha.model.layers:
        for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
            heads = proj.weight.reshape(H, d, -1)
            leaders = heads[::H // K]  # the first head of each group, copied to the whole group
            proj.weight.copy_(leaders.repeat_interleave(H // K, dim=0).reshape_as(proj.weight))
    what = f"{label}a target whose {H} heads already share K and V in {K} groups, converted by gqa.convert(..., {K}, pool=mean_pool_kv)"
    gqa = call(convert, what, mha, K, pool=mean_pool_kv)
    x = torch.randint(1, c.vocab_size, (n_tokens,), generator=torch.Generator().manual_seed(seed))
    pos = torch.arange(n_tokens)
    want = mha(x, pos, NoCacheBackend([n_tokens]))
    got = gqa(x, pos, NoCacheBackend([n_tokens]))
    diff = float((got - want).abs().max())
    checks.observe(f"{what}, {n_tokens} tokens (seed {seed}): the logits' largest change", diff, at_most=1e-8)
    assert diff < 1e-8, (f"{what}: the logits changed by up to {diff:.3g}, but converting should change nothing: "
                         f"the heads of each group are equal, so their mean is each of them. Your pooling mixes heads "
                         f"of different groups: query head h reads KV head h // (num_heads / kv_heads)")


def check_pooling(mean_pool_kv, cases, bad, converts, shared, label, hidden=False):
    """Task 3: your mean_pool_kv on (weight, num_heads, kv_heads) cases, on (rows, hidden, num_heads, kv_heads) that
    cannot be pooled, in gqa.convert of the target to K KV heads, and on a target whose heads already share K and V
    ((K, tokens, seed) cases). hidden: your weights are compared by the grader. Returns the number of cases."""
    checks.require_own(mean_pool_kv, "mean_pool_kv")
    with checks.reference_forbidden("mean_pool_kv", forbidden=ANSWER_KEY):
        for i, (w, H, K) in enumerate(cases):  # " (case i)": two cases of one shape stay apart for the grader
            check_pool(mean_pool_kv, w, H, K, label, hidden, f" (case {i})")
        for rows, width, H, K in bad:
            check_bad_kv(mean_pool_kv, rows, width, H, K, label)
        for K in converts:
            check_convert(mean_pool_kv, K, label, hidden)
        for K, n_tokens, seed in shared:
            check_shared_heads(mean_pool_kv, K, n_tokens, seed, label)
    return len(cases) + len(bad) + len(converts) + len(shared)
