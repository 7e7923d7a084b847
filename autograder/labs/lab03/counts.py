"""Lab 03, Tasks 1 to 4: the checks of param_count, kv_bytes_per_token, forward_flops and forward_bytes.

Reloaded by ``autograder.labs.lab03`` (see that module); the test cells call these through ``lab03``.
"""
from __future__ import annotations

import autograder.notebook_checks as checks
from autograder.labs.lab03.common import KIPPLY, L8, TINY, close, gap, graded, num, observe, why

# Task 1 · param_count

def count_causes(cfg):
    """The usual mistakes in a parameter count, each as (what it does to the count, what to fix)."""
    d, L, table = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size * cfg.hidden_size
    hd = d // cfg.num_attention_heads
    return [(0 if cfg.tie_word_embeddings else -table, "Llama-3's LM head is its own vocab_size x hidden_size matrix "
             "(tie_word_embeddings=False): count it as well as the embedding table"),
            (table if cfg.tie_word_embeddings else 0, "a tied LM head is the embedding table itself: count it once"),
            (-(2 * L + 1) * d, "the RMSNorm weights: two per layer and a final one, hidden_size each"),
            (2 * L * d * (cfg.num_attention_heads - cfg.num_key_value_heads) * hd, "k_proj and v_proj have "
             "num_key_value_heads x head_dim outputs (grouped-query attention), not hidden_size"),
            (-L * d * cfg.intermediate_size, "the SwiGLU MLP has three matrices: gate_proj, up_proj and down_proj")]


def check_param_count(param_count, cases, tiny):
    """Quoted sizes within 1% (naming the mistake that explains the exact count's error), then the tiny model exactly.

    cases: (model, config, the figure as quoted, where it comes from, the exact count it rounds).
    """
    with graded("param_count", param_count=param_count):
        for name, cfg, quoted, source, exact in cases:
            got = checks.as_count(param_count(cfg), f"param_count({name})")
            observe(f"param_count({name})", got, quoted, rel=0.01)
            assert close(got, quoted, 0.01), (f"param_count({name}): expected about {quoted / 1e9:.2f} B ({source}), "
                                              f"got {got / 1e9:.3f} B ({got:,}).{why(got, exact, count_causes(cfg))}")
        got = checks.as_count(param_count(TINY), "param_count(tiny target model)")
        observe("param_count(tiny target model)", got, tiny)
        assert got == tiny, (f"param_count(tiny target model): expected {tiny:,} (what torch counts for the trained "
                             f"model), got {got:,}.{why(got, tiny, count_causes(TINY))}")


# Task 2 · kv_bytes_per_token

def kv_causes(cfg, bpv, want):
    L, hd = cfg.num_hidden_layers, cfg.hidden_size // cfg.num_attention_heads
    return [(2 * L * (cfg.num_attention_heads - cfg.num_key_value_heads) * hd * bpv, "only the K/V heads are cached: "
             "num_key_value_heads, not num_attention_heads (that is what GQA saves)"),
            (-want / 2, "K and V are two tensors: the factor 2"),
            (want / bpv - want, "multiply by bytes_per_value (2 for 16-bit values)")]


def check_kv_bytes(kv_bytes_per_token, cases):
    """Each case exactly, then the default bytes_per_value (16-bit) and the worked 16 GiB of a 128K-token request.

    cases: (model, config, bytes_per_value, the expected bytes, where it comes from).
    """
    with graded("kv_bytes_per_token", kv_bytes_per_token=kv_bytes_per_token):
        for name, cfg, bpv, want, source in cases:
            got = num(kv_bytes_per_token(cfg, bytes_per_value=bpv), f"kv_bytes_per_token({name})")
            observe(f"kv_bytes_per_token({name}, bytes_per_value={bpv})", got, want)
            assert got == want, (f"kv_bytes_per_token({name}, bytes_per_value={bpv}): expected {want:,} bytes "
                                 f"({source}), got {got:,g}.{why(got, want, kv_causes(cfg, bpv, want))}")
        got = num(kv_bytes_per_token(L8), "kv_bytes_per_token(Llama-3-8B) with the default bytes_per_value")
        observe("kv_bytes_per_token(Llama-3-8B) with the default bytes_per_value", got, 131072)
        assert got == 131072, (f"kv_bytes_per_token(Llama-3-8B) with no bytes_per_value: expected 131,072 (16-bit "
                               f"by default), got {got:,}")
        # Worked example "KV per token": a 128K-token request's KV cache is 16 GiB, as big as the 8B model's weights.
        observe("a 128K-token request of Llama-3-8B: bytes of KV", 128 * 1024 * got, 16 * 2**30)
        assert 128 * 1024 * got == 16 * 2**30, ("a 128K-token request of Llama-3-8B should hold 16 GiB of KV (worked "
                                                "example 'KV per token')")


# Task 3 · forward_flops

PER_PAIR = 4 * 32 * 32 * 128  # Llama-3-8B: 4 x L x num_attention_heads x head_dim FLOPs per visible (query, key) pair
V, D = 128256, 4096  # Llama-3-8B's vocabulary and hidden size


def flops_causes(T, exact):
    """The usual mistakes in the FLOPs of a prefill of T tokens on Llama-3-8B."""
    pairs = T * (T + 1) // 2
    return [(2 * V * D * (T - 1), "the LM head runs for every token; with logits='last' only the last token of each "
             "sequence needs logits"),
            (PER_PAIR * (T * T - pairs),
             "the causal mask: a new token sees the cached tokens and the new ones up to itself, not every new one"),
            (2 * V * D * T, "the embedding lookup is a gather of rows, not a matmul: it does no FLOPs"),
            (-PER_PAIR * pairs,
             "attention is missing: QK^T and AV, in every layer and every query head, for each (query, key) pair"),
            (-PER_PAIR * pairs * 3 / 4, "every query head attends: num_attention_heads, not num_key_value_heads"),
            (-exact / 2, "a multiply-add is 2 FLOPs")]


def check_flops(forward_flops):
    """kipply's per-token count, the worked prefill times (compute-bound, so set by the FLOPs alone), then the rules."""
    with graded("forward_flops", forward_flops=forward_flops):
        f = lambda cfg, new, ctx, what, **kw: num(forward_flops(cfg, new, ctx, **kw), what)  # noqa: E731
        got = f(KIPPLY, [1], [0], "forward_flops(kipply's 52B, [1], [0])")
        observe("forward_flops(kipply's 52B, [1], [0])", got, 103_079_215_104, rel=0.01)
        assert close(got, 103_079_215_104, 0.01), (
            f"kipply's 52B model, one token at context 0: expected about 1.031e11 FLOPs (kipply, Transformer Inference "
            f"Arithmetic: 2 x 12 x n_layers x d_model^2 = 64 x 24 x 8192^2), got {got:.4g}")
        # Worked example "Prefill": a 2048-token prefill costs 21.2 us per token on the paper H100. It is compute-bound,
        # so time = FLOPs / (0.7 x 989 TFLOP/s) + 0.5 ms, and the FLOPs are (21.2 us x 2048 - 0.5 ms) x 0.7 x 989e12.
        got = f(L8, [2048], [0], "forward_flops(Llama-3-8B, [2048], [0])")
        want = (21.2e-6 * 2048 - 0.5e-3) * 0.7 * 989e12
        observe("forward_flops(Llama-3-8B, [2048], [0])", got, want, rel=0.01)
        assert close(got, want, 0.01), (f"Llama-3-8B, prefill of 2048 tokens: expected about {want:.4g} FLOPs (worked "
                                        f"example 'Prefill': 21.2 us per token, compute-bound), got {got:.4g}."
                                        f"{why(got, 29_688_401_494_016, flops_causes(2048, 29_688_401_494_016))}")
        # Worked example "Prefill": at 32K the cost per token grows to about 33 us: attention is quadratic.
        got = f(L8, [32768], [0], "forward_flops(Llama-3-8B, [32768], [0])")
        per_token_us = (got / (0.7 * 989e12) + 0.5e-3) / 32768 * 1e6
        observe("Llama-3-8B, prefill of 32,768 tokens on the paper H100: us per token, rounded", round(per_token_us),
                33)
        assert round(per_token_us) == 33, (
            f"Llama-3-8B, prefill of 32,768 tokens: expected about 33 us per token on the paper H100 (worked example "
            f"'Prefill'), your FLOPs ({got:.4g}) give {per_token_us:.1f} us."
            f"{why(got, 738_881_454_473_216, flops_causes(32768, 738_881_454_473_216))}")
        # Causal prefill: T(T+1)/2 pairs. The second difference in T is one pair's FLOPs (a full T x T mask gives two).
        second = (f(L8, [101], [0], "forward_flops([101], [0])") - 2 * f(L8, [100], [0], "forward_flops([100], [0])")
                  + f(L8, [99], [0], "forward_flops([99], [0])"))
        observe("Llama-3-8B: F(101) - 2 F(100) + F(99)", second, PER_PAIR, rel=1e-3)
        assert abs(second - PER_PAIR) <= 1e-3 * PER_PAIR, (
            f"Llama-3-8B prefill: F(101) - 2 F(100) + F(99) should be one (query, key) pair's FLOPs, "
            f"4 x 32 x 32 x 128 = {PER_PAIR:,} (causal attention: T(T+1)/2 pairs), got {second:,.0f}"
            + (" (twice that: a full T x T mask?)" if abs(second - 2 * PER_PAIR) < 1e-3 * PER_PAIR else ""))
        # Decode over a history (How to Scale Your Model, part 7): each cached token adds one pair.
        extra = f(L8, [1], [1000], "forward_flops([1], [1000])") - f(L8, [1], [0], "forward_flops([1], [0])")
        observe("Llama-3-8B: forward_flops([1], [1000]) - forward_flops([1], [0])", extra, PER_PAIR * 1000, rel=1e-6)
        assert close(extra, PER_PAIR * 1000, 1e-6), (
            f"Llama-3-8B decode: 1000 cached tokens should add 1000 pairs = {PER_PAIR * 1000:,} FLOPs of attention, "
            f"got {extra:,.0f} (the new token attends to every cached token and to itself)")
        # The LM head only where logits are used.
        extra = (f(L8, [100], [0], "forward_flops([100], [0], logits='all')", logits="all")
                 - f(L8, [100], [0], "forward_flops([100], [0])"))
        observe("Llama-3-8B: forward_flops([100], [0]) with logits='all' less with 'last'", extra, 2 * V * D * 99,
                rel=1e-6)
        assert close(extra, 2 * V * D * 99, 1e-6), (
            f"Llama-3-8B, 100-token prefill: logits='all' should cost 99 more LM-head rows than 'last', "
            f"2 x 128256 x 4096 x 99 = {2 * V * D * 99:,} FLOPs, got {extra:,.0f}")
        # A batch does each sequence's arithmetic: the FLOPs add up (only the bytes are shared).
        both = f(L8, [5, 1], [0, 300], "forward_flops([5, 1], [0, 300])")
        apart = f(L8, [5], [0], "forward_flops([5], [0])") + f(L8, [1], [300], "forward_flops([1], [300])")
        checks.observe("Llama-3-8B: forward_flops([5, 1], [0, 300]) against the sum of its two sequences alone "
                       "(relative difference)", gap(both, apart), at_most=1e-9)
        assert close(both, apart, 1e-9), (f"Llama-3-8B: a batch of a 5-token prefill and a decode at context 300 "
                                          f"should cost the sum of the two alone, {apart:,.0f} FLOPs, got {both:,.0f}")
        # A tied model (the course's tiny one): the LM head is the embedding table, but it still multiplies the last
        # row. One token at context 0: 6 layers of 4 x 256 x 256 + 3 x 256 x 704 weights, the head, one pair.
        got = f(TINY, [1], [0], "forward_flops(tiny model, [1], [0])")
        want = 2 * 6 * (4 * 256 * 256 + 3 * 256 * 704) + 2 * 4096 * 256 + 4 * 6 * 8 * 32 * 1
        observe("forward_flops(tiny model, [1], [0])", got, want, rel=1e-9)
        assert close(got, want, 1e-9), (
            f"the tiny model (tied embeddings), one token at context 0: expected {want:,} FLOPs, got {got:,.0f}."
            + why(got, want, [
                (-2 * 4096 * 256, "a tied LM head still runs: it multiplies the last row by the table"),
                (2 * 4096 * 256, "the embedding lookup is a gather of rows, not a matmul: it does no FLOPs")]))


# Task 4 · forward_bytes

KV = 131072  # Llama-3-8B's bytes of KV per token (Task 2)
W = (8_030_261_248 - V * D) * 2  # Llama-3-8B's weights without the embedding table, in bf16 (Task 1's count)


def bytes_causes(T, B, S, kv=KV, bpp=2, weights=W, table=V * D):
    """The usual mistakes in the bytes of a forward of T new tokens in B sequences over S cached tokens in all."""
    return [(table * bpp - T * D * bpp, "a token looks up one row of the embedding table: count hidden_size values "
             "per new token, not the whole table"),
            (table * bpp, "a token looks up one row of the embedding table, not the whole table"),
            (-table * bpp, "the (untied) LM head is a weight like any other: read once per forward"),
            (-T * D * bpp, "each new token reads its row of the embedding table (hidden_size x bytes_per_param bytes)"),
            (-T * kv, "the forward writes the KV of its new tokens: new tokens x kv_bytes_per_token"),
            (-S * kv, "each sequence reads its cached history: context tokens x kv_bytes_per_token"),
            ((B - 1) * weights, "the weights are read once per forward, not once per sequence: the batch shares them")]


def upstream(param_count, kv_bytes_per_token, cfg, name, n_want, kv_want, bpv=2):
    """forward_bytes usually builds on Tasks 1 and 2: say when they are off (nothing if they raise)."""
    try:
        n, kv = param_count(cfg), num(kv_bytes_per_token(cfg, bpv), "kv_bytes_per_token")
    except Exception:
        return ""
    off = ([f"param_count({name}) gives {n:,}, not {n_want:,}"] if n != n_want else []) + (
        [f"kv_bytes_per_token({name}, {bpv}) gives {kv:,.0f}, not {kv_want:,}"] if kv != kv_want else [])
    return (" Also, " + " and ".join(off) + ": pass the tests of Tasks 1 and 2 first.") if off else ""


def check_bytes(forward_bytes, forward_flops, param_count, kv_bytes_per_token):
    """The accounting rules on Llama-3-8B, the worked decode intensity and KV share, a ragged batch, int4 weights
    with a 16-bit cache, and a tied model in float32. Your forward_flops gives the intensity; your param_count and
    kv_bytes_per_token are asked only to say, in a failure, whether Tasks 1 and 2 are the cause."""
    def hint(cfg, name, n, kv, bpv=2):
        return upstream(param_count, kv_bytes_per_token, cfg, name, n, kv, bpv)
    with graded("forward_bytes", forward_bytes=forward_bytes):
        b = lambda cfg, new, ctx, what, **kw: num(forward_bytes(cfg, new, ctx, **kw), what)  # noqa: E731
        # miniengine/README.md, Cost model: every weight once, one row of the embedding table, one token of KV.
        got, want = b(L8, [1], [0], "forward_bytes(Llama-3-8B, [1], [0])"), W + D * 2 + KV
        observe("forward_bytes(Llama-3-8B, [1], [0])", got, want, rel=1e-9)
        assert close(got, want, 1e-9), (f"Llama-3-8B, one token at context 0: expected {want:,} bytes (the weights "
                                        f"without the embedding table, one row of it, one token of KV written), got "
                                        f"{got:,.0f}.{why(got, want, bytes_causes(1, 1, 0))}"
                                        f"{hint(L8, 'Llama-3-8B', 8_030_261_248, 131072)}")
        # Worked example "Batch-1 decode": a batch-1 decode step does about 1 FLOP per byte.
        F = num(forward_flops(L8, [1], [1024]), "forward_flops(Llama-3-8B, [1], [1024])")
        got = b(L8, [1], [1024], "forward_bytes(Llama-3-8B, [1], [1024])")
        observe("Llama-3-8B, batch-1 decode at context 1024: FLOPs per byte, rounded", round(F / got), 1)
        assert round(F / got) == 1, (f"Llama-3-8B, batch-1 decode at context 1024: the arithmetic intensity should be "
                                     f"about 1 FLOP/byte (worked example 'Batch-1 decode'), got {F / got:.2f} ({F:.4g} "
                                     f"FLOPs / {got:.4g} bytes).{why(got, 15_144_206_336, bytes_causes(1, 1, 1024))}")
        # Worked example "Decode batching": 256 sequences at context 1024 read 256 x 1024 tokens of KV, 70% of the
        # bytes.
        kv_read = 256 * 1024 * KV
        got = b(L8, [1] * 256, [1024] * 256, "forward_bytes(Llama-3-8B, [1] * 256, [1024] * 256)")
        observe("Llama-3-8B, decode of 256 at context 1024: the KV read's share of the bytes", kv_read / got, 0.70,
                rel=0.01)
        assert close(kv_read / got, 0.70, 0.01), (
            f"Llama-3-8B, decode of 256 sequences at context 1024: reading the KV history ({kv_read / 1e9:.1f} GB) "
            f"should be about 70% of the bytes (worked example 'Decode batching'), so about "
            f"{kv_read / 0.7 / 1e9:.1f} GB, got {got / 1e9:.2f} GB."
            f"{why(got, 49_405_239_296, bytes_causes(256, 256, 256 * 1024))}")
        # CS336 (Stanford, Spring 2025), lecture 10 "Inference": the KV read is 2 x B x S x L x K x H x 2 bytes.
        extra = (b(L8, [1] * 8, [1000] * 8, "forward_bytes([1] * 8, [1000] * 8)")
                 - b(L8, [1] * 8, [0] * 8, "forward_bytes([1] * 8, [0] * 8)"))
        want = 2 * 8 * 1000 * 32 * 8 * 128 * 2
        observe("Llama-3-8B: forward_bytes([1] * 8, [1000] * 8) - forward_bytes([1] * 8, [0] * 8)", extra, want,
                rel=1e-9)
        assert close(extra, want, 1e-9), (f"Llama-3-8B, 8 sequences: 1000 cached tokens each should add their KV read, "
                                          f"2 x 8 x 1000 x 32 x 8 x 128 x 2 = {want:,} bytes, got {extra:,.0f}")
        # One more prompt token: one more row of the table and one more token of KV written.
        extra = b(L8, [101], [0], "forward_bytes([101], [0])") - b(L8, [100], [0], "forward_bytes([100], [0])")
        observe("Llama-3-8B: forward_bytes([101], [0]) - forward_bytes([100], [0])", extra, D * 2 + KV, rel=1e-9)
        assert close(extra, D * 2 + KV, 1e-9), (f"Llama-3-8B prefill: one more prompt token should add one embedding "
                                                f"row and one token of KV, {D * 2 + KV:,} bytes, got {extra:,.0f}")
        got = b(L8, [1], [0], "forward_bytes(Llama-3-8B, [1], [0], 1, 1)", bytes_per_param=1, bytes_per_value=1)
        want = W // 2 + D + KV // 2
        observe("forward_bytes(Llama-3-8B, [1], [0], 1, 1)", got, want, rel=1e-9)
        assert close(got, want, 1e-9), (f"Llama-3-8B with 8-bit weights and KV: expected {want:,} bytes, got "
                                        f"{got:,.0f}: use bytes_per_param for the weights and bytes_per_value for "
                                        f"the KV")
        # Int4 weights (0.5 bytes per parameter, a fraction: do not round it) with a 16-bit KV cache, decode at 1024.
        got = b(L8, [1], [1024], "forward_bytes(Llama-3-8B, [1], [1024], 0.5, 2)", bytes_per_param=0.5,
                bytes_per_value=2)
        want = W / 4 + D * 0.5 + (1024 + 1) * KV
        observe("forward_bytes(Llama-3-8B, [1], [1024], 0.5, 2)", got, want, rel=1e-9)
        assert close(got, want, 1e-9), (f"Llama-3-8B with int4 weights (bytes_per_param=0.5) and a 16-bit cache "
                                        f"(bytes_per_value=2), decode at context 1024: expected {want:,.0f} bytes, "
                                        f"got {got:,.0f}: bytes_per_param may be fractional, and the weights and the "
                                        f"KV each use their own")
        # A ragged batch: a 5-token prefill and a decode at context 300 share one read of the weights.
        got = b(L8, [5, 1], [0, 300], "forward_bytes(Llama-3-8B, [5, 1], [0, 300])")
        want = W + 6 * D * 2 + 300 * KV + 6 * KV
        observe("forward_bytes(Llama-3-8B, [5, 1], [0, 300])", got, want, rel=1e-9)
        assert close(got, want, 1e-9), (f"Llama-3-8B, a 5-token prefill and a decode at context 300 in one forward: "
                                        f"expected {want:,} bytes (the weights once, 6 embedding rows, 300 tokens of "
                                        f"KV read, 6 written), got {got:,.0f}."
                                        f"{why(got, want, bytes_causes(6, 2, 300))}")
        # A tied table is read in full as the LM head; the looked-up row comes on top. Float32: 4 bytes.
        got = b(TINY, [1], [0], "forward_bytes(tiny, [1], [0], 4, 4)", bytes_per_param=4, bytes_per_value=4)
        want = 5_868_800 * 4 + 256 * 4 + 12288
        observe("forward_bytes(tiny, [1], [0], 4, 4)", got, want, rel=1e-9)
        assert close(got, want, 1e-9), (
            f"the tiny model (tied embeddings), one token, float32: expected {want:,} bytes (every weight, the tied "
            f"table included, once; one row; one token of KV), got {got:,.0f}."
            + why(got, want, [(-4096 * 256 * 4, "a tied table is read in full anyway, as the LM head"),
                              (-256 * 4, "the looked-up row of the embedding table comes on top"),
                              (-12288, "the forward writes the new token's KV")])
            + hint(TINY, "tiny model", 5_868_800, 12288, 4))
