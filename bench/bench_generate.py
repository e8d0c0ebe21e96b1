"""Batched agent runner vs a one-episode-at-a-time loop shaped like the original ReAct code.

Both run ReAct with SmolLM2-135M-Instruct (the embedded model, transformers backend), greedy,
on the same questions, over the same local wiki index, sharing one loaded model. The baseline is
`bench/original_react.py`: a plain for-loop over questions and steps, one model call
at a time with a batch of one, re-reading the whole prompt each call as the original does; the
same loop is also timed on our backend's prefix KV reuse, to show what batching alone adds. The project's runner is `pipeline.agent.run_episodes`: every
waiting episode in one generate() call per round. The script asserts both wrote identical
trajectories, then prints episodes per minute for each, the ratio, and generated tokens/s.

    python bench/bench_generate.py                       # 16 offline-eval questions, ~5-10 min on 2 CPU cores
    python bench/bench_generate.py --questions 32 --max-new-tokens 64 --device cuda
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.original_react import original_react_loop  # noqa: E402
from pipeline.agent import run_episodes  # noqa: E402
from pipeline.hotpotqa import load_question_set  # noqa: E402
from pipeline.methods import MethodSettings, build_method  # noqa: E402


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
    p.add_argument("--dtype", default="float32")
    return p.parse_args()


def wiki_index(path: str | None):
    from pipeline.wiki.index import LocalIndex, build_index

    if path:
        return LocalIndex(path)
    corpus = REPO.parent / "shared" / "data" / "wiki" / "corpus.jsonl"
    out = Path(tempfile.mkdtemp(prefix="bench-wiki-")) / "index.sqlite"
    build_index([corpus], out)
    return LocalIndex(out)


def summary(label: str, records: list[dict], seconds: float) -> dict:
    tokens = sum(r["completion_tokens"] for r in records)
    row = {"label": label, "episodes": len(records), "seconds": seconds,
           "episodes_per_min": 60 * len(records) / seconds, "generated_tokens": tokens,
           "tokens_per_s": tokens / seconds, "steps": sum(r["n_steps"] for r in records),
           "em": sum(r["em"] for r in records) / len(records)}
    print(f"{label:>28}: {row['episodes']} episodes in {seconds:7.1f} s = {row['episodes_per_min']:6.2f} ep/min, "
          f"{tokens} generated tokens = {row['tokens_per_s']:6.1f} tok/s, {row['steps']} steps, EM {row['em']:.2f}")
    return row


def trajectories(records: list[dict]) -> dict[str, tuple]:
    return {r["id"]: (r["text"], r["end_reason"], r["prediction"], r["completion_tokens"]) for r in records}


def main() -> int:
    args = parse_args()
    from pipeline.llm.config import LLMConfig
    from pipeline.llm.hf import TransformersLLM

    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    index = wiki_index(args.index)
    questions = load_question_set(args.question_set, limit=args.questions)
    settings = MethodSettings(exemplars=args.exemplars, max_steps=args.max_steps, max_new_tokens=args.max_new_tokens)
    method = build_method("react", settings)
    llm = TransformersLLM(LLMConfig(model="smollm2", device=args.device, dtype=args.dtype,
                                    max_batch_size=args.max_batch_size))
    print(f"{len(questions)} {args.question_set} questions, ReAct, {args.exemplars} exemplars "
          f"({len(method.prefix.text)} chars), greedy, max_new_tokens={args.max_new_tokens}, "
          f"max_steps={args.max_steps}, device={args.device}")

    # The original code's shape: a for-loop over questions and steps, one model call at a time,
    # the whole prompt re-read on every call (no KV reuse), as the ReAct notebook does.
    original_llm = TransformersLLM(LLMConfig(model="smollm2", device=args.device, dtype=args.dtype,
                                             max_batch_size=1, extra={"prefix_cache": False}))
    started = time.perf_counter()
    baseline = original_react_loop(original_llm, lambda: index, questions, method.prefix,
                                   max_steps=args.max_steps, max_new_tokens=args.max_new_tokens)
    base = summary("original loop, no KV reuse", baseline, time.perf_counter() - started)
    del original_llm

    # The same loop on our backend (prefix KV reuse), to separate batching from caching.
    started = time.perf_counter()
    cached = original_react_loop(llm, lambda: index, questions, method.prefix, max_steps=args.max_steps,
                                 max_new_tokens=args.max_new_tokens)
    loop = summary("original loop, prefix reuse", cached, time.perf_counter() - started)
    stats_before = dict(llm.stats)

    started = time.perf_counter()
    batched = run_episodes(llm, lambda: index, questions, method, max_in_flight=args.max_in_flight)
    ours = summary(f"batched (in flight {args.max_in_flight})", batched, time.perf_counter() - started)
    calls = llm.stats["calls"] - stats_before["calls"]

    same = trajectories(baseline) == trajectories(batched) == trajectories(cached)
    print(f"identical trajectories (all three): {same}; batched rounds (generate calls): {calls}; "
          f"episode-steps: {ours['steps']}")
    ratio = ours["episodes_per_min"] / base["episodes_per_min"]
    print(f"speed-up vs the original loop: {ratio:.2f}x episodes/min (target >= 4x)")
    print(f"  of which batching alone (vs the same loop with prefix reuse): "
          f"{ours['episodes_per_min'] / loop['episodes_per_min']:.2f}x")
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if not same:
        diff = [k for k in trajectories(baseline) if trajectories(baseline)[k] != trajectories(batched).get(k)]
        print(f"DIFFERENT trajectories for {len(diff)} questions, e.g. {diff[:3]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
