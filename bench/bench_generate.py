"""Generation benchmarks, each part timed on the same work in one process (SmolLM2-135M-Instruct,
the embedded model, transformers backend, greedy, ReAct prompts with our 6 exemplars):

  backend    the backend alone: generated tokens/s at batch 1, 8 and 16 (64 new tokens after the
             ~1,660-token few-shot prompt), and the time to pre-fill one full prompt against the
             same prompt with the cached exemplar prefix; in fp32 and in bf16, with their ratio.
  precision  the batched runner in fp32 and in bf16 on the same questions: episodes/min, the bf16 /
             fp32 ratio, and the share of episodes whose trajectories stay identical.
  runner     the batched agent runner against a one-episode-at-a-time loop shaped like the original
             ReAct code (`bench/original_react.py`: a plain loop over questions and
             steps, one call at a time, the whole prompt re-read each call), and the same loop on
             our backend's prefix KV reuse, to show what batching alone adds; all three must write
             identical trajectories.

Every part repeats its timings (--repeats), prints median [min-max] and the spread, the load
average, and the fraction of the matmul compute limit measured at the start (bench/machine.py):
model FLOP/s = 2 x parameters x tokens/s.

    python bench/bench_generate.py                                # backend + precision parts
    python bench/bench_generate.py --parts runner --questions 16  # ~5-10 min on 2 idle CPU cores
    python bench/bench_generate.py --parts backend --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from machine import compute_limits, load_average, spread  # noqa: E402

from bench.original_react import original_react_loop  # noqa: E402
from pipeline.agent.scheduler import run_episodes  # noqa: E402
from pipeline.methods import MethodSettings, build_method  # noqa: E402
from pipeline.tasks.hotpotqa.questions import load_question_set  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--questions", type=int, default=16)
    p.add_argument("--question-set", default="offline-eval")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--max-steps", type=int, default=7)
    p.add_argument("--max-in-flight", type=int, default=16)
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--exemplars", default="ours", help="ours | paper | a prompts_naive.json path")
    p.add_argument("--index", default=None, help="a wiki index; default: build one from the shared corpus")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", help="the runner part's dtype")
    p.add_argument("--parts", nargs="+", default=["backend", "precision"], choices=["backend", "precision", "runner"])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8, 16], help="backend part: batch sizes")
    p.add_argument("--backend-new-tokens", type=int, default=64)
    return p.parse_args()


def wiki_index(path: str | None):
    from pipeline.wiki.index import LocalIndex, build_index

    if path:
        return LocalIndex(path)
    corpus = REPO.parent / "shared" / "data" / "wiki" / "corpus.jsonl"
    out = Path(tempfile.mkdtemp(prefix="bench-wiki-")) / "index.sqlite"
    build_index([corpus], out)
    return LocalIndex(out)


def summary(label: str, records: list[dict], seconds: list[float]) -> dict:
    tokens = sum(r["completion_tokens"] for r in records)
    speeds = [60 * len(records) / s for s in seconds]
    row = {"label": label, "episodes": len(records), "speeds": speeds, "generated_tokens": tokens,
           "steps": sum(r["n_steps"] for r in records), "em": sum(r["em"] for r in records) / len(records)}
    print(f"{label:>28}: {row['episodes']} episodes in {spread(seconds)} s = {spread(speeds)} ep/min, "
          f"{tokens} generated tokens = {tokens / statistics.median(seconds):6.1f} tok/s, {row['steps']} steps, "
          f"EM {row['em']:.2f}", flush=True)
    return row


def trajectories(records: list[dict]) -> dict[str, tuple]:
    return {r["id"]: (r["text"], r["end_reason"], r["prediction"], r["completion_tokens"]) for r in records}


def smollm2(args, dtype: str, **extra):
    from pipeline.llm.config import LLMConfig
    from pipeline.llm.hf import TransformersLLM

    kwargs = {"max_batch_size": args.max_batch_size, **extra}
    return TransformersLLM(LLMConfig(model="smollm2", device=args.device, dtype=dtype, **kwargs))


def timed(fn, repeats: int) -> tuple[list[float], object]:
    seconds, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - started)
    return seconds, result


def gflops_note(llm, tokens_per_s: float, limits: dict, precision: str) -> str:
    flops = 2 * sum(p.numel() for p in llm.model.parameters()) * tokens_per_s / 1e9
    return f"{flops:.2f} GFLOP/s = {100 * flops / limits[precision]:.1f}% of the {precision} matmul limit"


def run_backend(args, questions, method, limits) -> None:
    """tokens/s at each batch size, and prefill with and without the cached exemplar prefix."""
    prompts = [method.prefix.text + f"Question: {q.question}\n" for q in questions]
    rates = {precision: backend_one(args, prompts, dtype, precision, limits)
             for dtype, precision in (("float32", "fp32"), ("bfloat16", "bf16"))}
    print(f"\nbackend bf16 / fp32 (same work; >1 = bf16 faster; {load_average()}):")
    for key in [*args.batches, "prefill"]:
        a, b = statistics.median(rates["bf16"][key]), statistics.median(rates["fp32"][key])
        print(f"  {'batch ' + str(key) if key != 'prefill' else 'prefill'}: {(a / b if key != 'prefill' else b / a):.2f}x")


def backend_one(args, prompts: list[str], dtype: str, precision: str, limits: dict) -> dict:
    from pipeline.llm.base import GenerationRequest

    llm = smollm2(args, dtype)
    n_prompt = len(llm.tokenizer(prompts[0]).input_ids)
    print(f"\nbackend, {precision}: prompts of ~{n_prompt} tokens, {args.backend_new_tokens} new tokens, "
          f"{load_average()}", flush=True)
    rates: dict = {}
    llm.generate([GenerationRequest(prompts[0], max_new_tokens=1)])  # caches the exemplar prefix
    for batch in args.batches:
        reqs = [GenerationRequest(prompts[i % len(prompts)], max_new_tokens=args.backend_new_tokens)
                for i in range(batch)]
        seconds, tokens = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            out = llm.generate(reqs)
            seconds.append(time.perf_counter() - started)
            tokens.append(sum(c[0].completion_tokens for c in out))
        rates[batch] = [t / s for t, s in zip(tokens, seconds, strict=True)]
        print(f"  batch {batch:2d}: {spread(rates[batch])} generated tok/s; "
              f"{gflops_note(llm, statistics.median(rates[batch]), limits, precision)}", flush=True)
    one = [GenerationRequest(prompts[-1], max_new_tokens=1)]
    two = [GenerationRequest(p, max_new_tokens=1) for p in prompts[:2]]
    cached = []
    for _ in range(args.repeats):
        llm.generate(two)  # the stored prefix back to the exemplars alone (what two questions share)
        cached += timed(partial(llm.generate, one), 1)[0]  # this question's line on top of it
    llm.use_prefix_cache = False
    full, _ = timed(partial(llm.generate, one), args.repeats)
    llm.use_prefix_cache = True
    rates["prefill"] = full
    print(f"  prefill of one {n_prompt}-token prompt: full {spread(full)} s; with the cached exemplar "
          f"prefix {spread(cached)} s; full prefill {n_prompt / statistics.median(full):.0f} tok/s = "
          f"{gflops_note(llm, n_prompt / statistics.median(full), limits, precision)}", flush=True)
    return rates


def run_precision(args, questions, method, index, limits) -> None:
    """The batched runner in fp32 and bf16: speed ratio and the share of identical trajectories."""
    outputs, speeds = {}, {}
    for dtype, precision in (("float32", "fp32"), ("bfloat16", "bf16")):
        outputs[precision], speeds[precision] = runner_one(args, questions, method, index, dtype, precision, limits)
    ratios = [b / a for a, b in zip(speeds["fp32"], speeds["bf16"], strict=True)]
    fp32, bf16 = trajectories(outputs["fp32"]), trajectories(outputs["bf16"])
    same = sum(fp32[k] == bf16.get(k) for k in fp32)
    em = {p: sum(r["em"] for r in outputs[p]) / len(outputs[p]) for p in outputs}
    print(f"batched runner bf16 / fp32 = {statistics.median(ratios):.2f}x episodes/min "
          f"[{min(ratios):.2f}-{max(ratios):.2f}] (target >= 2x on a CPU with native bf16); "
          f"identical trajectories fp32 vs bf16: {same} / {len(fp32)} = {100 * same / len(fp32):.0f}%; "
          f"EM fp32 {em['fp32']:.3f}, bf16 {em['bf16']:.3f}; {load_average()}")


def runner_one(args, questions, method, index, dtype: str, precision: str, limits: dict):
    llm = smollm2(args, dtype)
    print(f"\nbatched runner, {precision}: {len(questions)} questions, {load_average()}", flush=True)
    seconds, records = timed(partial(run_episodes, llm, lambda: index, questions, method,
                                     max_in_flight=args.max_in_flight), args.repeats)
    speeds = [60 * len(records) / s for s in seconds]
    tokens = sum(r["completion_tokens"] for r in records)
    print(f"  {spread(speeds)} episodes/min; {tokens} generated tokens per repeat; "
          f"{gflops_note(llm, tokens / statistics.median(seconds), limits, precision)} (generated tokens only)",
          flush=True)
    return records, speeds


def run_runner(args, questions, method, index) -> int:
    llm = smollm2(args, args.dtype)
    print(f"{len(questions)} {args.question_set} questions, ReAct, {args.exemplars} exemplars "
          f"({len(method.prefix.text)} chars), greedy, max_new_tokens={args.max_new_tokens}, "
          f"max_steps={args.max_steps}, device={args.device}, dtype={args.dtype}, {args.repeats} repeats")
    # The original code's shape: a for-loop over questions and steps, one model call at a time,
    # the whole prompt re-read on every call (no KV reuse), as the ReAct notebook does.
    original_llm = smollm2(args, args.dtype, max_batch_size=1, extra={"prefix_cache": False})
    loop_args = {"max_steps": args.max_steps, "max_new_tokens": args.max_new_tokens}
    secs, baseline = timed(partial(original_react_loop, original_llm, lambda: index, questions, method.prefix,
                                   **loop_args), args.repeats)
    base = summary("original loop, no KV reuse", baseline, secs)

    # The same loop on our backend (prefix KV reuse), to separate batching from caching.
    secs, cached = timed(partial(original_react_loop, llm, lambda: index, questions, method.prefix, **loop_args),
                         args.repeats)
    loop = summary("original loop, prefix reuse", cached, secs)
    calls_before = llm.stats["calls"]
    secs, batched = timed(partial(run_episodes, llm, lambda: index, questions, method,
                                  max_in_flight=args.max_in_flight), args.repeats)
    ours = summary(f"batched (in flight {args.max_in_flight})", batched, secs)
    calls = (llm.stats["calls"] - calls_before) // args.repeats

    same = trajectories(baseline) == trajectories(batched) == trajectories(cached)
    print(f"identical trajectories (all three): {same}; batched rounds (generate calls): {calls}; "
          f"episode-steps: {ours['steps']}")
    ratios = [b / a for a, b in zip(base["speeds"], ours["speeds"], strict=True)]
    print(f"speed-up vs the original loop: {statistics.median(ratios):.2f}x episodes/min "
          f"[{min(ratios):.2f}-{max(ratios):.2f}] (target >= 4x)")
    print(f"  of which batching alone (vs the same loop with prefix reuse): "
          f"{statistics.median(ours['speeds']) / statistics.median(loop['speeds']):.2f}x; {load_average()}")
    if not same:
        diff = [k for k in trajectories(baseline) if trajectories(baseline)[k] != trajectories(batched).get(k)]
        print(f"DIFFERENT trajectories for {len(diff)} questions, e.g. {diff[:3]}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    args = parse_args()
    from pipeline.core import precision

    print(f"{load_average()}; {precision.inference('auto', args.device).line('auto would choose')}")
    limits = compute_limits()
    index = wiki_index(args.index)
    questions = load_question_set(args.question_set, limit=args.questions)
    settings = MethodSettings(exemplars=args.exemplars, max_steps=args.max_steps, max_new_tokens=args.max_new_tokens)
    method = build_method("react", settings)
    code = 0
    if "backend" in args.parts:
        run_backend(args, questions, method, limits)
    if "precision" in args.parts:
        run_precision(args, questions, method, index, limits)
    if "runner" in args.parts:
        code = run_runner(args, questions, method, index)
    compute_limits()  # again at the end: did the machine's speed change during the run?
    return code


if __name__ == "__main__":
    raise SystemExit(main())
