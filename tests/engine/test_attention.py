"""The one attention op against torch's own implementation, and RoPE against the complex-number rotation."""
import math

import pytest
import torch

from miniengine.attention import apply_rope, causal_attention, rope_cos_sin

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


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


def test_one_batched_call_equals_attention_sequence_by_sequence():
    """NoCacheBackend pads a ragged batch into one attention call; each sequence must get what it gets alone."""
    from miniengine.attention import NoCacheBackend
    torch.manual_seed(2)
    lens = [5, 1, 3]
    q, k, v = torch.randn(9, 4, 8), torch.randn(9, 2, 8), torch.randn(9, 2, 8)
    batched = NoCacheBackend(lens).attend(0, q, k, v)
    start = 0
    for n in lens:
        pos = torch.arange(n)
        alone = causal_attention(q[start:start + n], k[start:start + n], v[start:start + n], pos, pos)
        torch.testing.assert_close(batched[start:start + n], alone, atol=1e-6, rtol=1e-6)
        start += n


def test_cached_backend_mixes_prefill_and_decode_in_one_call():
    """Two sequences decode one token each while a third prefills four: all in one pass over one arena."""
    from miniengine.kv import CachedBackend, KVArena, KVCache
    from miniengine.model import LlamaConfig
    torch.manual_seed(3)
    cfg = LlamaConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1)
    arena = KVArena(cfg, 40)
    caches = [KVCache.in_arena(arena, n) for n in (10, 12, 8)]
    hist = [torch.randn(n, 2, 4) for n in (6, 3)]  # earlier tokens' K (V = K + 1) of the two decoding sequences
    for c, h in zip(caches, hist):
        c.write(0, 0, h, h + 1)
        c.length = h.shape[0]
    q, k = torch.randn(6, 4, 4), torch.randn(6, 2, 4)
    backend = CachedBackend(caches, [1, 1, 4])
    assert backend.positions().tolist() == [6, 3, 0, 1, 2, 3]
    out = backend.attend(0, q, k, k + 1)
    full_k = [torch.cat([hist[0], k[0:1]]), torch.cat([hist[1], k[1:2]]), k[2:6]]
    rows = [slice(0, 1), slice(1, 2), slice(2, 6)]
    for fk, r, (start, n) in zip(full_k, rows, [(6, 1), (3, 1), (0, 4)]):
        pos = torch.arange(start + n)
        alone = causal_attention(q[r], fk, fk + 1, pos[start:], pos)
        torch.testing.assert_close(out[r], alone, atol=1e-6, rtol=1e-6)
    backend.advance()
    assert [c.length for c in caches] == [7, 4, 4]
