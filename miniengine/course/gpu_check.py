"""``make gpu-check``: everything that needs a CUDA GPU, in one run, with one summary at the end.

    python -m miniengine.course.gpu_check [--skip-notebooks] [--skip-bench]

1. Golden cases on CUDA: every visible and hidden case through ``LLM(device="cuda")`` in float32
   with TF32 off, at batch limits 1 and 64, in the contiguous layout, under memory pressure, with
   speculation, the n=4 forks, the int8/int4 and GQA models on their own golden files, and through the
   float64 reference for a sample.
   The engine runs with CUDA graphs (the default), and once with ``enforce_eager=True``.
2. ``bench batch --device cuda``: this engine against HF ``generate`` at batches 1, 4, 16, 64; ``bench gpu``:
   eager against CUDA-graph decode steps and the cost model.
3. Every notebook top to bottom with ``DEVICE="cuda"`` and ``FAST=True`` (papermill).

On a machine without CUDA it says so and exits 0: the course's own tests never need a GPU.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from miniengine.paths import GOLDEN, REPO_ROOT


def three_decodes(engine) -> list:
    """Three short greedy requests, prefilled by one (eager) step: the sequences of the next decode step."""
    from miniengine.sampling import SamplingParams

    for prompt in ([5, 6, 7], [8, 9], [10, 11, 12, 13, 14]):
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=4))
    engine.step()
    seqs = list(engine.scheduler.running)
    for s in seqs:  # what the scheduler does before a decode step
        engine.kv.append_slot(s)
    return seqs


def padding_on_cuda() -> str:
    """A padded graph step: the rows that repeat row 0 must compute row 0's values to the last bit, because they
    write row 0's K/V into row 0's slot (``index_copy_`` with a repeated index keeps one copy, any one)."""
    from miniengine.llm import LLM

    engine = LLM(device="cuda", max_num_seqs=8).engine
    graphs = engine.runner.graphs
    if graphs is None:
        return "padding: FAILED, CUDA graphs were not captured"
    graphs.run(three_decodes(engine))  # 3 sequences in bucket 4: row 3 repeats row 0
    out = graphs.outputs[(4, graphs.key_buckets[0])]
    same = torch.equal(out[3], out[0])
    return (f"padding: the padded row's logits {'equal' if same else 'differ from'} row 0's bit for bit"
            + ("" if same else "; FAILED: padded rows could write other bits into row 0's KV slot"))


def golden_on_cuda() -> list[str]:
    from miniengine.llm import LLM
    from miniengine.model import load_model
    from miniengine.paths import TARGET
    from miniengine.reference import naive_generate
    from miniengine.sampling import SamplingParams

    cases = json.loads((GOLDEN / "visible.json").read_text())["cases"]
    hidden = REPO_ROOT / "autograder" / "hidden" / "golden.json"
    if hidden.exists():
        cases += json.loads(hidden.read_text())["cases"]
    lines = []
    for seqs, eager in ((1, False), (64, False), (64, True), (5, False)):
        # CUDA graphs are on by default (engine/cuda_graphs.py); buckets 1, 2, 4, 5 for max_num_seqs=5: 3 pads to 4
        llm = LLM(device="cuda", max_num_seqs=seqs, enforce_eager=eager)
        outs = llm.generate([c["prompt_token_ids"] for c in cases], [SamplingParams(**c["params"]) for c in cases])
        bad = [c["name"] for c, o in zip(cases, outs) if o.token_ids != c["token_ids"]]
        graphs = llm.engine.runner.graphs
        how = ("eager" if graphs is None else
               f"CUDA graphs, {sum(graphs.steps.values())} replayed steps in buckets "
               f"{sorted(b for b, n in graphs.steps.items() if n)}, {graphs.padded_rows} padded rows")
        lines.append(f"engine, cuda float32, max_num_seqs={seqs}, {how}: {len(cases) - len(bad)}/{len(cases)} golden "
                     f"cases exact" + (f"; FAILED: {bad[:5]}" if bad else ""))
        if not eager and graphs is None:
            lines.append("FAILED: CUDA graphs were not captured (see the warning above)")
    lines.append(padding_on_cuda())
    # The later milestones on CUDA: each layout, speculation, forks, quantized and GQA models on their own golden.
    from miniengine.course import golden as golden_mod
    from miniengine.paths import MODELS

    def run(label, llm, cs):
        outs = llm.generate([c["prompt_token_ids"] for c in cs], [SamplingParams(**c["params"]) for c in cs])
        if cs and "completions" in cs[0]:
            bad = [c["name"] for c, o in zip(cs, outs) if [x.token_ids for x in o.outputs] != [w["token_ids"] for w in c["completions"]]]
        else:
            bad = [c["name"] for c, o in zip(cs, outs) if o.token_ids != c["token_ids"]]
        lines.append(f"{label}: {len(cs) - len(bad)}/{len(cs)} golden cases exact" + (f"; FAILED: {bad[:5]}" if bad else ""))

    run("engine, cuda, contiguous layout", LLM(device="cuda", kv_layout="contiguous"), cases)
    run("engine, cuda, paged, small pool (preemption)", LLM(device="cuda", kv_cache_tokens=512, block_size=8), cases)
    run("engine, cuda, speculative (coupled, γ=4)", LLM(device="cuda", speculative_model="draft", num_speculative_tokens=4), cases)
    forks = json.loads((GOLDEN / "visible.json").read_text())["fork_cases"]
    run("engine, cuda, n=4 forks (copy-on-write)", LLM(device="cuda"), forks)
    for scheme in golden_mod.QUANT_SCHEMES:
        run(f"engine, cuda, {scheme} weights", LLM(device="cuda", quantization=scheme),
            json.loads(golden_mod.quant_file(scheme).read_text())["cases"])
    run("engine, cuda, GQA model", LLM(model=str(MODELS / golden_mod.GQA_MODEL), device="cuda"),
        json.loads(golden_mod.gqa_file().read_text())["cases"])
    model = load_model(TARGET, dtype=torch.float64, device="cuda")
    sample = cases[::8]
    ref = naive_generate(model, [c["prompt_token_ids"] for c in sample], [SamplingParams(**c["params"]) for c in sample])
    bad = [c["name"] for c, r in zip(sample, ref) if r.token_ids != c["token_ids"]]
    lines.append(f"reference, cuda float64: {len(sample) - len(bad)}/{len(sample)} golden cases exact"
                 + (f"; FAILED: {bad}" if bad else ""))
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m miniengine.course.gpu_check")
    p.add_argument("--skip-notebooks", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device on this machine; nothing to check here (run it where a GPU is).")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False  # exactness checks run in true float32
    torch.backends.cudnn.allow_tf32 = False
    summary, failed = [f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}"], False
    t0 = time.monotonic()
    for line in golden_on_cuda():
        summary.append(line)
        failed |= "FAILED" in line
    if not args.skip_bench:
        r = subprocess.run([sys.executable, "-m", "miniengine", "bench", "batch", "--device", "cuda"],
                           capture_output=True, text=True, cwd=REPO_ROOT)
        print(r.stdout + r.stderr)
        summary += [ln for ln in r.stdout.splitlines() if ln.startswith(("batch 16", "ours / HF"))] or [f"bench failed: {r.stderr[-300:]}"]
        failed |= r.returncode != 0
    if not args.skip_bench:
        r = subprocess.run([sys.executable, "-m", "miniengine", "bench", "gpu"], capture_output=True, text=True,
                           cwd=REPO_ROOT)
        print(r.stdout + r.stderr)
        summary += [ln for ln in r.stdout.splitlines() if ln.startswith(("graphs/eager", "tiny model"))] or [
            f"bench gpu failed: {r.stderr[-300:]}"]
        failed |= r.returncode != 0
    if not args.skip_notebooks:
        r = subprocess.run([sys.executable, "-m", "autograder", "regress", "--device", "cuda"], capture_output=True,
                           text=True, cwd=REPO_ROOT)
        print(r.stdout[-4000:] + r.stderr[-2000:])
        summary += [ln for ln in r.stdout.splitlines() if ln.startswith("|") or "notebooks passed" in ln]
        failed |= r.returncode != 0
    print(f"\n== gpu-check summary ({time.monotonic() - t0:.0f} s) ==")
    print("\n".join(summary))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
