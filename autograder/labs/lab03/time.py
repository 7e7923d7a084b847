"""Lab 03, Tasks 5 to 7: the checks of step_time and ridge_point, the worked decode and prefill tables, the memory
functions, and your cost model driving the simulator.

Reloaded by ``autograder.labs.lab03`` (see that module); the test cells call these through ``lab03``.
"""
from __future__ import annotations

import math

import autograder.notebook_checks as checks
from autograder.labs.lab03.common import A100, H100, L8, L70, PAPER_GPUS, close, graded, num, observe, why

# Task 5 · step_time and ridge_point

def check_ridge_and_step(step_time, ridge_point, ridges, floors, formulas):
    """ridge_point within 1% of the worked figures; step_time's bandwidth floor (efficiencies 1, no overhead) within
    1%; then step_time against the task's formula, exactly, naming the mistake whose size matches the error.

    ridges: (gpu, keyword arguments, FLOP/byte, where it comes from); floors: (gpu, seconds to read 16.06 GB, where it
    comes from); formulas: (FLOPs, bytes, gpu, keyword arguments).
    """
    with graded("your step_time or ridge_point", step_time=step_time, ridge_point=ridge_point):
        for gpu, kw, want, source in ridges:
            got = num(ridge_point(gpu, **kw), f"ridge_point({gpu['name']})")
            args = "".join(f", {k}={v}" for k, v in kw.items())  # as the call was written: ", compute_eff=0.7, ..."
            observe(f"ridge_point({gpu['name']}{args})", got, want, rel=0.01)
            assert close(got, want, 0.01), (f"ridge_point({gpu['name']}{args}): "
                                            f"expected about {want} FLOP/byte ({source}), got {got:.1f}")
        # The floor of a batch-1 decode step: reading 16.06 GB of weights at the full bandwidth, with nothing else.
        for gpu, want, source in floors:
            got = num(step_time(0.0, 16.06e9, gpu, 1.0, 1.0, 0.0), "step_time(0, 16.06e9, ...)")
            observe(f"step_time(0, 16.06e9, {gpu['name']}, 1, 1, 0)", got, want, rel=0.01)
            assert close(got, want, 0.01), (f"{gpu['name']}: reading 16.06 GB at {gpu['bandwidth'] / 1e12} TB/s with "
                                            f"efficiencies 1 and no overhead should take about {want * 1e3} ms "
                                            f"({source}), got {got * 1e3:.3f} ms")
        # The formula, with the defaults (miniengine/README.md, Cost model) and with other settings.
        for F, B, gpu, kw in formulas:
            ce, be, oh = kw.get("compute_eff", 0.7), kw.get("bandwidth_eff", 0.8), kw.get("overhead_s", 5e-4)
            compute, memory = F / (ce * gpu["peak_flops"]), B / (be * gpu["bandwidth"])
            want = max(compute, memory) + oh
            got = num(step_time(F, B, gpu, **kw), f"step_time({F:g}, {B:g}, {gpu['name']})")
            settings = ", ".join(f"{k}={v}" for k, v in kw.items()) or "the defaults"
            observe(f"step_time({F:g}, {B:g}, {gpu['name']}, {settings})", got, want, rel=1e-9)
            assert close(got, want, 1e-9), (
                f"step_time({F:g} FLOPs, {B:g} bytes, {gpu['name']}, {settings}): expected {want * 1e3:.4f} ms "
                f"(compute {compute * 1e3:.4f} ms, memory {memory * 1e3:.4f} ms), got {got * 1e3:.4f} ms."
                + why(got, want, [
                    (-oh, f"every forward pays overhead_s ({oh * 1e3:g} ms) on top"),
                    (min(compute, memory), "compute and memory overlap: take the larger term, not the sum"),
                    (compute * ce * ce - compute if compute > memory else memory * be * be - memory,
                     "divide by the efficiency: reaching only part of the peak takes longer"),
                    (compute * ce - compute if compute > memory else memory * be - memory,
                     "apply the efficiencies: compute_eff x peak FLOP/s and bandwidth_eff x bandwidth")]))


def check_ridge_and_step_exact(step_time, ridge_point, forward_flops, forward_bytes, ridges, times, passes):
    """Each within 1e-6 of the right figure, which stays with the grader (a case may still carry it as its last
    field, then checked here too). ridges: (gpu, keyword arguments); times: (FLOPs, bytes, gpu, keyword arguments);
    passes: (what, config, gpu, new_tokens, context, step_time's keyword arguments), priced by your forward_flops
    and forward_bytes."""
    with graded("your code", step_time=step_time, ridge_point=ridge_point):
        for gpu, kw, *want in ridges:
            what = f"hidden case ridge_point({gpu['name']}, {kw})"
            got = num(ridge_point(gpu, **kw), what)
            observe(what, got, rel=1e-6)
            if want:
                assert close(got, want[0], 1e-6), f"{what}: expected {want[0]:.3f}, got {got:.3f}"
        for F, B, gpu, kw, *want in times:
            what = f"hidden case step_time({F:g}, {B:g}, {gpu['name']}, {kw or 'defaults'})"
            got = num(step_time(F, B, gpu, **kw), "hidden case step_time")
            observe(what, got, rel=1e-6)
            if want:
                assert close(got, want[0], 1e-6), f"{what}: expected {want[0] * 1e3:.4f} ms, got {got * 1e3:.4f} ms"
        for name, cfg, gpu, new, ctx, kw, *want in passes:
            F = num(forward_flops(cfg, new, ctx), f"hidden case {name}: forward_flops")
            B = num(forward_bytes(cfg, new, ctx), f"hidden case {name}: forward_bytes")
            got = num(step_time(F, B, gpu, **kw), f"hidden case {name}: step_time")
            observe(f"hidden case {name}: step_time", got, rel=1e-6)
            if want:
                assert close(got, want[0], 1e-6), (f"hidden case {name}: expected {want[0] * 1e3:.4f} ms, got "
                                                   f"{got * 1e3:.4f} ms")


# The worked tables: Tasks 3 to 5 together

def priced(forward_flops, forward_bytes, step_time, cfg, gpu, new, ctx, what):
    """One pass priced by your functions, with their defaults: (FLOPs, bytes, seconds) as plain floats."""
    F = num(forward_flops(cfg, new, ctx), f"{what}: forward_flops")
    B = num(forward_bytes(cfg, new, ctx), f"{what}: forward_bytes")
    return F, B, num(step_time(F, B, gpu), f"{what}: step_time")


def detail(gpu, F, B):
    """Your two terms, so that a failure shows which count is off."""
    return (f" Your forward_flops gives {F:.4g} FLOPs (compute term {F / (0.7 * gpu['peak_flops']) * 1e3:.3f} ms) and "
            f"forward_bytes {B / 1e9:.3f} GB (memory term {B / (0.8 * gpu['bandwidth']) * 1e3:.3f} ms). Pass the "
            f"forward_flops, forward_bytes and step_time tests above first: they name the usual mistakes.")


def check_worked_tables(forward_flops, forward_bytes, step_time, decode, prefill, a100, bounds, gqa):
    """The worked examples' times, each within 1% (see the cell for the figures and where they come from)."""
    price = lambda *a: priced(forward_flops, forward_bytes, step_time, *a)  # noqa: E731
    with graded("your code", step_time=step_time):
        steps = {}
        for batch, want in decode:  # per token, at context 1024
            what = f"H100, Llama-3-8B, decode of {batch} sequence(s) at context 1024"
            F, B, t = price(L8, H100, [1] * batch, [1024] * batch, what)
            steps[batch] = t
            observe(f"{what}: seconds per token", t / batch, want, rel=0.01)
            assert close(t / batch, want, 0.01), (f"{what}: expected about {want * 1e6:,.0f} us per token (worked "
                                                  f"example 'Decode batching'), got {t / batch * 1e6:,.1f} us."
                                                  f"{detail(H100, F, B)}")
        # Worked example "Decode batching": from batch 1 to 64 the step grows from about 6 to about 9 ms, the
        # throughput 42-fold.
        observe("H100 decode at context 1024: the step at batch 1 and 64, in ms, rounded",
                [round(steps[1] * 1e3), round(steps[64] * 1e3)], [6, 9])
        assert round(steps[1] * 1e3) == 6 and round(steps[64] * 1e3) == 9, (
            f"H100 decode: the step should go from about 6 ms (batch 1) to about 9 ms (batch 64) (worked example "
            f"'Decode batching'), got {steps[1] * 1e3:.2f} and {steps[64] * 1e3:.2f} ms")
        gain = (64 / steps[64]) / (1 / steps[1])
        observe("H100 decode at context 1024: tokens/s at batch 64 over batch 1", gain, 42, rel=0.01)
        assert close(gain, 42, 0.01), (f"H100 decode: batch 64 should give about 42x the tokens/s of batch 1 (worked "
                                       f"example 'Decode batching'), got {gain:.1f}x")
        for T in prefill:  # a short prefill's time is reading the weights once
            F, B, t = price(L8, H100, [T], [0], f"H100, Llama-3-8B, prefill of {T} tokens")
            observe(f"H100, Llama-3-8B, prefill of {T} tokens: seconds", t, 6.1e-3, rel=0.01)
            assert close(t, 6.1e-3, 0.01), (f"H100, Llama-3-8B, prefill of {T} tokens: expected about 6.1 ms (worked "
                                            f"example 'Prefill': the time to read the weights once), got "
                                            f"{t * 1e3:.3f} ms.{detail(H100, F, B)}")
        # Worked example "Prefill": per token, 21.2 us at 2048 tokens, about 33 us at 32K.
        F, B, t = price(L8, H100, [2048], [0], "H100, prefill of 2048 tokens")
        observe("H100, Llama-3-8B, prefill of 2048 tokens: seconds per token", t / 2048, 21.2e-6, rel=0.01)
        assert close(t / 2048, 21.2e-6, 0.01), (f"H100, Llama-3-8B, prefill of 2048 tokens: expected about 21.2 us per "
                                                f"token (worked example 'Prefill'), got {t / 2048 * 1e6:.2f} us."
                                                f"{detail(H100, F, B)}")
        F, B, t = price(L8, H100, [32768], [0], "H100, prefill of 32768 tokens")
        observe("H100, Llama-3-8B, prefill of 32,768 tokens: us per token, rounded", round(t / 32768 * 1e6), 33)
        assert round(t / 32768 * 1e6) == 33, (f"H100, Llama-3-8B, prefill of 32,768 tokens: expected about 33 us per "
                                              f"token (worked example 'Prefill'), got {t / 32768 * 1e6:.2f} us."
                                              f"{detail(H100, F, B)}")
        for gpu, want in a100:  # batch-1 decode at context 512
            F, B, t = price(L8, gpu, [1], [512], f"{gpu['name']}, batch-1 decode at context 512")
            observe(f"{gpu['name']}, Llama-3-8B, batch-1 decode at context 512: seconds", t, want, rel=0.01)
            assert close(t, want, 0.01), (f"{gpu['name']}, Llama-3-8B, batch-1 decode at context 512: expected about "
                                          f"{want * 1e3} ms (worked example 'A100'), got {t * 1e3:.3f} ms."
                                          f"{detail(gpu, F, B)}")
        for T, bound in bounds:  # prefills on the A100, either side of the crossover
            F, B, _ = price(L8, A100, [T], [0], f"A100, prefill of {T} tokens")
            got = "compute" if F / (0.7 * A100["peak_flops"]) > B / (0.8 * A100["bandwidth"]) else "memory"
            observe(f"A100, Llama-3-8B, prefill of {T} tokens: the bound", got, bound)
            assert got == bound, (f"A100, Llama-3-8B, prefill of {T} tokens: should be {bound}-bound (worked example "
                                  f"'A100'), your counts make it {got}-bound.{detail(A100, F, B)}")
        for name, cfg, want in gqa:  # a batch-32 decode step at context 1024
            F, B, t = price(cfg, H100, [1] * 32, [1024] * 32, f"H100, Llama-3-8B {name}, batch 32")
            observe(f"H100, Llama-3-8B {name}, decode of 32 at context 1024: seconds", t, want, rel=0.01)
            assert close(t, want, 0.01), (f"H100, Llama-3-8B {name}, decode of 32 sequences at context 1024: expected "
                                          f"about {want * 1e3} ms (worked example 'Without GQA'), got "
                                          f"{t * 1e3:.3f} ms.{detail(H100, F, B)}")


# Task 6 · kv_capacity_tokens and max_batch

def memory_variants(weights, kv, memory=80e9):
    """What the usual mistakes give, to name the one made."""
    return {math.floor((memory - weights) / kv): "only 90% of the memory is usable (usable_memory=0.9)",
            math.floor((0.9 * memory) / kv):
                "the weights take their share first: subtract param_count x bytes_per_param",
            math.floor((0.9 * memory * 2**30 / 1e9 - weights) / kv): "decimal units: 80 GB is 80e9 bytes, not 80 GiB",
            math.ceil((0.9 * memory - weights) / kv): "round down: a token's KV fits whole or not at all"}


def check_memory(kv_capacity_tokens, max_batch, cases, *, param_count, kv_bytes_per_token, forward_flops,
                 forward_bytes, step_time):
    """The worked capacities on an H100 exactly, Llama-3-70B's weights too big, the 64-fold drop of the best
    throughput from context 512 to 32K, and other settings passed as keywords to both functions.

    cases: (model, config, KV tokens, sequences of 1024 tokens, bytes of weights, KV bytes per token, where it comes
    from). Your param_count and kv_bytes_per_token are asked only to say, in a failure, whether Tasks 1 and 2 are
    the cause; your forward_flops, forward_bytes and step_time price the largest batches that fit.
    """
    with graded("your code", kv_capacity_tokens=kv_capacity_tokens, max_batch=max_batch):
        for name, cfg, tokens, batch, weights, kv, source in cases:
            got = checks.as_count(kv_capacity_tokens(cfg, H100), f"kv_capacity_tokens({name}, H100)")
            observe(f"kv_capacity_tokens({name}, H100)", got, tokens)
            hint = memory_variants(weights, kv).get(got)
            try:  # the capacity builds on Tasks 1 and 2: say when they are off
                upstream = ((f" Also, param_count({name}) gives {param_count(cfg):,}, not {weights // 2:,}."
                             if param_count(cfg) != weights // 2 else "")
                            + (f" Also, kv_bytes_per_token({name}) gives {num(kv_bytes_per_token(cfg), 'kv'):,.0f}, "
                               f"not {kv:,}." if num(kv_bytes_per_token(cfg), "kv") != kv else ""))
            except Exception:
                upstream = ""
            assert got == tokens, (f"kv_capacity_tokens({name}, H100): expected {tokens:,} tokens ({source}: 90% of "
                                   f"80 GB minus {weights / 1e9:.2f} GB of weights, over {kv:,} bytes per token), got "
                                   f"{got:,}." + (f" Likely cause: {hint}" if hint else "") + upstream)
            got = checks.as_count(max_batch(cfg, H100, 1024), f"max_batch({name}, H100, 1024)")
            observe(f"max_batch({name}, H100, 1024)", got, batch)
            assert got == batch, (f"max_batch({name}, H100, context 1024): expected {batch} sequences ({source}), got "
                                  f"{got}" + (" (round down: a sequence's KV fits whole or not at all)"
                                              if got == batch + 1 else ""))
        # Worked example "Memory ceiling": Llama-3-70B's weights alone (141 GB) exceed an H100.
        got = checks.as_count(kv_capacity_tokens(L70, H100), "kv_capacity_tokens(Llama-3-70B, H100)")
        observe("kv_capacity_tokens(Llama-3-70B, H100)", got, 0)
        assert got == 0, (f"kv_capacity_tokens(Llama-3-70B, H100): the weights alone do not fit (worked example "
                          f"'Memory ceiling'): expected 0, got {got:,}")
        got = checks.as_count(max_batch(L70, H100, 1024), "max_batch(Llama-3-70B, H100, 1024)")
        observe("max_batch(Llama-3-70B, H100, 1024)", got, 0)
        assert got == 0, f"max_batch(Llama-3-70B, H100, 1024): expected 0 (nothing fits), got {got}"
        # Worked example "Memory ceiling": from context 512 to 32K the best single-GPU decode throughput drops about
        # 64-fold.
        best = {}
        for ctx in (512, 32768):
            b = checks.as_count(max_batch(L8, H100, ctx), f"max_batch(Llama-3-8B, H100, {ctx})")
            F = num(forward_flops(L8, [1] * b, [ctx] * b), "forward_flops")
            B = num(forward_bytes(L8, [1] * b, [ctx] * b), "forward_bytes")
            best[ctx] = b / num(step_time(F, B, H100), "step_time")
        observe("Llama-3-8B on an H100, the largest batch that fits: tokens/s at context 512 over 32K",
                best[512] / best[32768], 64, rel=0.01)
        assert close(best[512] / best[32768], 64, 0.01), (
            f"Llama-3-8B on an H100, the largest batch that fits: context 512 should give about 64x the tokens/s of "
            f"context 32K (worked example 'Memory ceiling'), got {best[512] / best[32768]:.1f}x ({best[512]:,.0f} and "
            f"{best[32768]:,.0f} tokens/s)")
        # Other settings, as keywords: 8-bit weights and KV, 80% of the memory usable. Both functions must use them.
        kw = dict(usable_memory=0.8, bytes_per_param=1, bytes_per_value=1)
        tokens = math.floor((0.8 * 80e9 - 8_030_261_248 * 1) / (2 * 32 * 8 * 128 * 1))
        got = checks.as_count(kv_capacity_tokens(L8, H100, **kw), "kv_capacity_tokens(Llama-3-8B, H100, 0.8, 1, 1)")
        observe("kv_capacity_tokens(Llama-3-8B, H100, usable_memory=0.8, bytes_per_param=1, bytes_per_value=1)",
                got, tokens)
        assert got == tokens, (f"kv_capacity_tokens(Llama-3-8B, H100, usable_memory=0.8, bytes_per_param=1, "
                               f"bytes_per_value=1): expected {tokens:,} tokens (80% of 80 GB minus 8.03 GB of 8-bit "
                               f"weights, over 65,536 bytes per token), got {got:,}: use the arguments, not the "
                               f"defaults")
        got = checks.as_count(max_batch(L8, H100, 2048, **kw), "max_batch(Llama-3-8B, H100, 2048, 0.8, 1, 1)")
        observe("max_batch(Llama-3-8B, H100, 2048, usable_memory=0.8, bytes_per_param=1, bytes_per_value=1)", got,
                tokens // 2048)
        assert got == tokens // 2048, (f"max_batch(Llama-3-8B, H100, context 2048, usable_memory=0.8, "
                                       f"bytes_per_param=1, bytes_per_value=1): expected {tokens // 2048}, got {got}: "
                                       f"pass the keyword arguments on to kv_capacity_tokens")


def check_memory_exact(kv_capacity_tokens, max_batch, cases):
    """cases: (what, config, gpu, keyword arguments, context), exactly; the right KV tokens and sequences stay with
    the grader (a case may still carry them as two more fields, then checked here too)."""
    with graded("your code", kv_capacity_tokens=kv_capacity_tokens, max_batch=max_batch):
        for name, cfg, gpu, kw, ctx, *want in cases:
            got = checks.as_count(kv_capacity_tokens(cfg, gpu, **kw), f"hidden case {name}: kv_capacity_tokens")
            observe(f"hidden case {name}: kv_capacity_tokens", got)
            if want:
                assert got == want[0], f"hidden case {name}: kv_capacity_tokens should be {want[0]:,}, got {got:,}"
            got = checks.as_count(max_batch(cfg, gpu, ctx, **kw), f"hidden case {name}: max_batch")
            observe(f"hidden case {name}, context {ctx}: max_batch", got)
            if want:
                assert got == want[1], f"hidden case {name}, context {ctx}: max_batch should be {want[1]}, got {got}"


# Task 7 · your engine

def check_engine(forward_flops, forward_bytes, step_time, runs):
    """Simulate each seeded workload on your cost model; the run's figures must match the course's to 1e-6.

    runs: (what, config, paper GPU's name, workload dict(n, rate, seed), policy, seats, the expected figures); a
    hidden run has no expected figures: they stay with the grader, which compares the figures observed here.
    """
    # Imported here, not above: the cost-model checks of Tasks 1 to 6 do not depend on the simulator.
    from miniengine.serving import metrics, simulator as sim

    with graded("your cost model", forward_flops=forward_flops, forward_bytes=forward_bytes, step_time=step_time):
        for label, cfg, gpu, work, policy, seats, *want in runs:
            model = sim.CostModelFromFunctions(cfg, PAPER_GPUS[gpu], forward_flops, forward_bytes, step_time)
            run = sim.simulate(sim.chat_workload(work["n"], work["rate"], work["seed"]), policy, model,
                               max_num_seqs=seats)
            s = metrics.summarize(run.timelines)
            got = {"last_token_s": max(t.token_times[-1] for t in run.timelines), "ttft_p50_s": s["ttft_p50_s"],
                   "tpot_p50_s": s["tpot_p50_s"], "throughput_tok_s": s["throughput_tok_s"]}
            for key, value in got.items():
                checks.observe(f"{label}: {key}", float(value), rel=1e-6,
                               **({"expect": float(want[0][key])} if want else {}))
            for key, expected in (want[0] if want else {}).items():
                value = float(got[key])
                assert abs(value - expected) <= 1e-6 * abs(expected), (
                    f"your engine, {label}: {key} = {value:.6g}, expected {expected:.6g}. Each step is priced by "
                    f"your forward_flops, forward_bytes and step_time with their default arguments; if their own "
                    f"tests pass, check them on ragged batches (prefills and decodes in one pass)")
