"""The one attention op against torch's own implementation, and RoPE against the complex-number rotation."""
import math

import pytest
import torch

from miniengine.attention import apply_rope, causal_attention, rope_cos_sin


def attention_by_hand(q, k, v, group):
    """The textbook formula, one head and one query at a time, in float64."""
    T, H, d = q.shape
    out = torch.zeros(T, H, d, dtype=torch.float64)
    for h in range(H):
        kh, vh = k[:, h // group].double(), v[:, h // group].double()
        for i in range(T):
            w = torch.softmax((kh[: i + 1] @ q[i, h].double()) / math.sqrt(d), dim=0)
            out[i, h] = w @ vh[: i + 1]
    return out


@pytest.mark.parametrize("n_heads,n_kv", [(4, 4), (4, 2), (6, 1)])
def test_causal_attention_matches_the_formula(n_heads, n_kv):
    torch.manual_seed(0)
    T, d = 7, 8
    q, k, v = torch.randn(T, n_heads, d), torch.randn(T, n_kv, d), torch.randn(T, n_kv, d)
    pos = torch.arange(T)
    ours = causal_attention(q, k, v, pos, pos)
    torch.testing.assert_close(ours.double(), attention_by_hand(q, k, v, n_heads // n_kv), atol=1e-5, rtol=1e-5)
    ours64 = causal_attention(q.double(), k.double(), v.double(), pos, pos)
    torch.testing.assert_close(ours64, attention_by_hand(q, k, v, n_heads // n_kv), atol=1e-12, rtol=1e-12)


def test_decode_query_sees_the_whole_history():
    """A single query at position 5 over keys 0..5 equals row 5 of full causal attention."""
    torch.manual_seed(1)
    q, k, v = torch.randn(6, 2, 4), torch.randn(6, 2, 4), torch.randn(6, 2, 4)
    pos = torch.arange(6)
    full = causal_attention(q, k, v, pos, pos)
    one = causal_attention(q[5:], k, v, pos[5:], pos)
    torch.testing.assert_close(one[0], full[5])


def test_rope_is_a_rotation_of_pairs_half_a_head_apart():
    """HF rotate-half: dims i and i + d/2 form a complex number rotated by pos * theta^(-2i/d)."""
    d, theta = 8, 10000.0
    x = torch.randn(5, 1, d, dtype=torch.float64)
    pos = torch.arange(5)
    cos, sin = rope_cos_sin(pos, d, theta, torch.float64)
    ours = apply_rope(x, cos, sin)
    z = torch.complex(x[..., : d // 2], x[..., d // 2 :])
    freqs = torch.tensor([theta ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    rotated = z * torch.polar(torch.ones(5, 1, d // 2, dtype=torch.float64), pos[:, None, None] * freqs)
    torch.testing.assert_close(ours, torch.cat([rotated.real, rotated.imag], -1))
    assert math.isclose(ours.norm().item(), x.norm().item(), rel_tol=1e-12)
