"""``bench online`` (the capstone): a client over HTTP against the same trace served in-process.

    python -m miniengine bench online                      # starts `serve` itself on a free port
    python -m miniengine bench online --url http://127.0.0.1:8000 --rates 2 4 8 16

Each rate gets the same requests (prompts cut from the validation code, lognormal output lengths, greedy, end of
text ignored) at Poisson arrival times scaled to that rate.  The client (``openai``'s AsyncOpenAI, one task per
request) sends each at its arrival time and streams it; a chunk per engine step is one token, so the client
timestamps every token as it lands.  The same trace is then replayed in-process on an engine with the same budgets
(``miniengine.engine.replay``), so HTTP, JSON and streaming's cost is a ratio measured in one run on one machine.
The client checks that both runs produced the same text.  Latencies are client-side: TTFT from sending the request
to the first chunk, which a server's own /metrics cannot see.
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import time

import numpy as np

from miniengine.course.bench.inputs import batch_prompts, warm_up
from miniengine.sampling import SamplingParams
from miniengine.timeline import RequestTimeline


def make_requests(tok, n: int, mean_new_tokens: int = 48, output_sigma: float = 0.5, seed: int = 0):
    """``n`` requests (prompt ids cut from the validation code, ~32 tokens; an output length) and unit-rate Poisson
    arrival times: divide them by a rate to get that rate's trace (every rate replays the same requests)."""
    from miniengine.serving.workloads import lognormal_lengths

    rng = np.random.default_rng(seed)
    prompt_lens = np.clip(lognormal_lengths(rng, 32, 0.5, n), 4, 128).astype(int)
    new_lens = (np.clip(lognormal_lengths(rng, mean_new_tokens, output_sigma, n), 4, 256)
                if output_sigma > 0 else np.full(n, mean_new_tokens)).astype(int)
    unit_arrivals = np.cumsum(rng.exponential(1.0, n))
    windows = batch_prompts(tok, n, 128)
    return [(w[:p], int(n)) for w, p, n in zip(windows, prompt_lens, new_lens)], unit_arrivals


async def stream_trace(url: str, model: str, requests, arrivals) -> tuple[list[RequestTimeline], list[str], int]:
    """Send each request (prompt ids, max_tokens) at its arrival time (seconds from now) and stream it; every chunk's
    arrival is a token's time.  Returns the client-side timelines, the texts, and how many streams' chunk count
    differed from their usage (a server that sends several tokens in one chunk)."""
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    start = time.perf_counter()
    mismatched = 0

    async def one(i):
        nonlocal mismatched
        ids, n = requests[i]
        await asyncio.sleep(max(0.0, arrivals[i] - (time.perf_counter() - start)))
        sent = time.perf_counter() - start
        timeline = RequestTimeline(sent, len(ids), request_id=i)
        text = []
        stream = await client.completions.create(model=model, prompt=ids, max_tokens=n, temperature=0, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True})
        async for chunk in stream:
            now = time.perf_counter() - start
            if chunk.choices:
                timeline.record_token(now)
                text.append(chunk.choices[0].text)
            elif chunk.usage is not None and chunk.usage.completion_tokens != timeline.output_tokens:
                mismatched += 1  # a server that sends several tokens in one chunk: its ITL is not per token
        return timeline, "".join(text)

    results = await asyncio.gather(*(one(i) for i in range(len(requests))))
    await client.close()
    return [r[0] for r in results], [r[1] for r in results], mismatched


def replay_in_process(model, tok, requests, arrivals, max_num_seqs: int, kv_cache_tokens: int):
    """The same requests at the same arrival times, replayed on an engine in this process (greedy, end of text
    ignored); returns the timelines and the texts."""
    from miniengine.config import EngineConfig
    from miniengine.engine import LLMEngine, TraceRequest, replay

    engine = LLMEngine(EngineConfig(model=model, max_num_seqs=max_num_seqs, kv_cache_tokens=kv_cache_tokens))
    warm_up(engine)
    trace = [TraceRequest(float(a), ids, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
             for (ids, n), a in zip(requests, arrivals)]
    results = replay(engine, trace)
    return [r.timeline for r in results], [tok.decode(r.seq.output_token_ids) for r in results]


@contextlib.contextmanager
def _server(args):
    """The URL to measure: --url, or a `serve` started here with the same budgets as the in-process engine."""
    if args.url:
        yield args.url.rstrip("/"), args.served_model_name
        return
    from miniengine.serving.api.launch import spawned

    with spawned("--model", args.model, "--max-num-seqs", str(args.max_num_seqs), "--kv-cache-tokens",
                 str(args.kv_cache_tokens), startup_s=120.0, threads=args.threads) as url:
        yield url, args.model


def _row(label, s) -> str:
    ms = {k: 1e3 * s[k] for k in s if k.endswith("_s") and k != "duration_s"}
    return (f"{label:<22} {ms['ttft_p50_s']:>7.0f} {ms['ttft_p90_s']:>7.0f} {ms['ttft_p99_s']:>7.0f} "
            f"{ms['tpot_p50_s']:>6.1f} {ms['tpot_p90_s']:>6.1f} {ms['tpot_p99_s']:>6.1f} "
            f"{ms['itl_p50_s']:>6.1f} {ms['itl_p99_s']:>6.1f} {ms['e2e_p50_s']:>7.0f} {ms['e2e_p99_s']:>7.0f} "
            f"{s['throughput_tok_s']:>7.0f} {100 * s['slo_attainment']:>5.0f}% {s['goodput_req_s']:>6.2f}")


def online(args) -> int:
    import torch

    from miniengine.model import load_model
    from miniengine.paths import resolve_model_dir
    from miniengine.serving import metrics
    from miniengine.tokenizer import load_tokenizer

    torch.set_num_threads(args.threads)  # the server is started with the same environment
    model_dir = resolve_model_dir(args.model)
    tok = load_tokenizer(model_dir)
    requests, unit = make_requests(tok, args.requests, args.mean_new_tokens, args.output_sigma, args.seed)
    model = load_model(model_dir)
    slo = metrics.SLO(args.slo_ttft, args.slo_tpot)
    rows, same, split = [], True, 0
    with _server(args) as (url, served):
        alone = requests[:args.batch_one]  # one at a time: each arrives after the one before has finished
        budgets = (args.max_num_seqs, args.kv_cache_tokens)
        online_1 = [asyncio.run(stream_trace(url, served, [r], [0.0]))[0][0] for r in alone]
        local_1 = [replay_in_process(model, tok, [r], [0.0], *budgets)[0][0] for r in alone]
        for rate in args.rates:
            arrivals = unit / rate
            timelines, texts, mismatched = asyncio.run(stream_trace(url, served, requests, arrivals))
            local, local_texts = replay_in_process(model, tok, requests, arrivals, *budgets)
            same = same and texts == local_texts
            split += mismatched
            rows.append((rate, metrics.summarize(timelines, slo), metrics.summarize(local, slo)))
    print(f"online benchmark: {model_dir.name} over HTTP ({'--url ' + args.url if args.url else 'serve, started here'}) "
          f"against the same trace in-process; {args.requests} requests per rate, prompts ~32 and outputs "
          f"~{args.mean_new_tokens} tokens (lognormal, sigma {args.output_sigma}), greedy, {args.max_num_seqs} seats, torch threads "
          f"{torch.get_num_threads()}, SLO TTFT <= {args.slo_ttft} s and TPOT <= {1e3 * args.slo_tpot:.0f} ms; "
          f"milliseconds unless marked")
    print(f"{'rate/s  where':<22} {'TTFT50':>7} {'TTFT90':>7} {'TTFT99':>7} {'TPOT50':>6} {'TPOT90':>6} "
          f"{'TPOT99':>6} {'ITL50':>6} {'ITL99':>6} {'E2E50':>7} {'E2E99':>7} {'tok/s':>7} {'SLO':>6} {'good/s':>6}")
    for rate, s_online, s_local in rows:
        print(_row(f"{rate:<7g} online", s_online))
        print(_row(f"{rate:<7g} in-process", s_local))
    if alone:
        t_online, t_local = (metrics.percentiles(metrics.tpot(t) for t in ts)["p50"] for ts in (online_1, local_1))
        print(f"batch 1 ({len(alone)} requests one at a time): TPOT P50 online {1e3 * t_online:.2f} ms, in-process "
              f"{1e3 * t_local:.2f} ms: {t_online / t_local:.2f}x")
    print(f"same text online and in-process: {same}")
    if split:
        print(f"warning: {split} streams carried several tokens in one chunk: their ITL is per chunk, not per token")
    meeting = [(rate, s, loc) for rate, s, loc in rows if s["slo_attainment"] >= args.attainment]
    if args.plot:
        _plot(rows, args.plot)
        print(f"plot: {args.plot}")
    if not meeting:
        print(f"online/in-process goodput at the highest rate meeting the SLO: none of the rates met it "
              f"({100 * args.attainment:.0f}% attainment)")
        return 0 if same else 1
    rate, s, loc = meeting[-1]
    ratio = s["goodput_req_s"] / loc["goodput_req_s"] if loc["goodput_req_s"] else math.nan
    print(f"TPOT P50 online/in-process at {rate:g}/s: {s['tpot_p50_s'] / loc['tpot_p50_s']:.2f}x")
    print(f"online/in-process goodput at the highest rate meeting the SLO: {ratio:.2f}x")
    return 0 if same else 1


def _plot(rows, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [r for r, _, _ in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for k, label in ((1, "online (HTTP, streaming)"), (2, "in-process")):
        a.plot(rates, [row[k]["goodput_req_s"] for row in rows], "o-", label=label)
        b.plot(rates, [1e3 * row[k]["ttft_p90_s"] for row in rows], "o-", label=label)
    a.set(xlabel="arrival rate (requests/s)", ylabel="goodput (requests/s meeting the SLO)")
    b.set(xlabel="arrival rate (requests/s)", ylabel="TTFT P90 (ms)", yscale="log")
    a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def register(sub) -> None:
    """Adds ``bench online`` and its flags to the ``bench`` sub-commands."""
    s = sub.add_parser("online", help="a streaming client over HTTP at several Poisson rates, against in-process")
    s.add_argument("--url", default=None, help="a running server (default: start `serve` on a free port)")
    s.add_argument("--served-model-name", default="target", help="the model name to send with --url")
    s.add_argument("--model", default="target")
    s.add_argument("--rates", type=float, nargs="+", default=[16.0, 64.0, 256.0, 1024.0], help="arrivals per second")
    s.add_argument("--requests", type=int, default=64, help="requests per rate")
    s.add_argument("--batch-one", type=int, default=8, help="requests sent one at a time first, for batch 1's TPOT")
    s.add_argument("--mean-new-tokens", type=int, default=48)
    s.add_argument("--output-sigma", type=float, default=0.5,
                   help="spread of the output lengths (lognormal sigma); 0 gives every request the same length")
    s.add_argument("--max-num-seqs", type=int, default=32)
    s.add_argument("--kv-cache-tokens", type=int, default=16384)
    s.add_argument("--slo-ttft", type=float, default=1.0, help="seconds")
    s.add_argument("--slo-tpot", type=float, default=0.05, help="seconds")
    s.add_argument("--attainment", type=float, default=0.9, help="the share of requests that must meet the SLO")
    s.add_argument("--threads", type=int, default=1, help="torch threads, here and in the server it starts")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--plot", default=None, help="write goodput and TTFT P90 against the rate to this PNG")
    s.set_defaults(func=online)
