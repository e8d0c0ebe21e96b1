"""Episodes/min of the round-based runner against continuous scheduling, against a real
continuous-batching server: llama.cpp's `llama-server` serving the embedded SmolLM2-135M-Instruct
GGUF over /v1/completions (ReAct, our 6 exemplars, greedy), or any OpenAI-compatible server that
is already running (--base-url, e.g. `vllm serve`).

    scripts/build_llama_server.sh          # once: builds llama-server from the llama.cpp sources (~15 min)
    LLAMA_SERVER=~/.cache/react-pipeline/llama-server/bin/llama-server python bench/bench_server.py
    python bench/bench_server.py --base-url http://127.0.0.1:8000/v1 --model NAME

The binary is $LLAMA_SERVER, else `llama-server` on PATH; with neither (and no --base-url) the
benchmark prints one line saying so and exits 0. Each timed run gets a fresh llama-server (so
no run reads prompts another cached), with one slot per episode in flight; the schedules take
turns first. Prints episodes/min for each schedule, median [min-max] over --repeats, the
continuous / rounds ratio, the share of episodes whose records are identical under both
(greedy; a server may batch numerics differently), and the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from machine import load_average, spread  # noqa: E402

from pipeline.agent.scheduler import SCHEDULES, run_episodes  # noqa: E402
from pipeline.core.errors import PipelineError  # noqa: E402
from pipeline.llm.config import LLMConfig  # noqa: E402
from pipeline.llm.openai_http import OpenAICompatibleLLM  # noqa: E402
from pipeline.methods import MethodSettings, build_method  # noqa: E402
from pipeline.tasks.hotpotqa.questions import load_question_set  # noqa: E402

ENV_VAR = "LLAMA_SERVER"
ALIAS = "smollm2"  # the model name llama-server serves the GGUF under (--alias)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", help="a running OpenAI-compatible server (then no llama-server is started)")
    p.add_argument("--model", default=ALIAS, help="the served model name (with --base-url)")
    p.add_argument("--gguf", help="the GGUF file llama-server serves (default: the embedded SmolLM2)")
    p.add_argument("--questions", type=int, default=16)
    p.add_argument("--question-set", default="offline-eval")
    p.add_argument("--index", help="a wiki index; default: build one from the shared corpus")
    p.add_argument("--max-in-flight", type=int, default=8, help="episodes at once (= llama-server slots)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--max-steps", type=int, default=7)
    p.add_argument("--ctx-per-slot", type=int, default=4096, help="llama-server context tokens per slot")
    p.add_argument("--threads", type=int, help="llama-server --threads (default: its own)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--start-timeout", type=float, default=120.0, help="seconds to wait for llama-server")
    return p.parse_args(argv)


def find_llama_server(environ: dict | None = None) -> str | None:
    """$LLAMA_SERVER (it must be an executable file), else `llama-server` on PATH, else None."""
    environ = os.environ if environ is None else environ
    given = environ.get(ENV_VAR)
    if given:
        path = Path(given).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise PipelineError(f"{ENV_VAR}={given} is not an executable file; "
                             "build one with scripts/build_llama_server.sh or unset it")
        return str(path)
    return shutil.which("llama-server", path=environ.get("PATH"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(binary: str, gguf: str, args: argparse.Namespace) -> Iterator[str]:
    """A llama-server on 127.0.0.1 with one slot per episode in flight; yields its /v1 URL once
    /health answers 200, and stops it afterwards."""
    port = free_port()
    command = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "--alias", ALIAS,
               "-np", str(args.max_in_flight), "-c", str(args.max_in_flight * args.ctx_per_slot)]
    if args.threads:
        command += ["--threads", str(args.threads)]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(proc, f"http://127.0.0.1:{port}/health", args.start_timeout, log)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float, log) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PipelineError(f"llama-server exited with {proc.returncode} before it was healthy:\n"
                             + tail(log))
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:  # refused while it starts, 503 while the model loads
            pass
        time.sleep(0.2)
    raise PipelineError(f"llama-server not healthy at {url} after {timeout_s:.0f} s:\n" + tail(log))


def tail(log, lines: int = 20) -> str:
    log.flush()
    log.seek(0)
    return "".join(log.readlines()[-lines:])


def open_llm(base_url: str, model: str, max_in_flight: int) -> OpenAICompatibleLLM:
    """The pipeline's OpenAI-compatible backend, allowed as many calls as there are episodes."""
    cfg = LLMConfig(backend="openai", model=model, base_url=base_url, api_key_env="",
                    max_concurrency=max_in_flight, timeout_s=600.0, max_retries=1)
    llm = OpenAICompatibleLLM(cfg)
    llm.check_available()
    return llm


def timed_run(base_url: str, model: str, schedule: str, questions: list, index, args) -> tuple[float, list[dict]]:
    settings = MethodSettings(max_new_tokens=args.max_new_tokens, max_steps=args.max_steps)
    llm = open_llm(base_url, model, args.max_in_flight)
    try:
        start = time.perf_counter()
        records = run_episodes(llm, lambda: index, questions, build_method("react", settings),
                               max_in_flight=args.max_in_flight, schedule=schedule)
        return time.perf_counter() - start, records
    finally:
        llm.close()


def server_for_run(args: argparse.Namespace, binary: str | None) -> contextlib.AbstractContextManager[str]:
    """One server per timed run: a fresh llama-server, or the one at --base-url; yields its /v1 URL."""
    if args.base_url:
        return contextlib.nullcontext(args.base_url)
    from pipeline.hub.smollm2 import gguf_path

    return llama_server(binary, args.gguf or str(gguf_path()), args)


def identical_share(a: list[dict], b: list[dict]) -> tuple[int, int]:
    def key(records):
        return {r["id"]: {k: v for k, v in r.items() if k != "seconds"} for r in records}

    ka, kb = key(a), key(b)
    return sum(ka[i] == kb.get(i) for i in ka), len(ka)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    binary = None
    if not args.base_url:
        binary = find_llama_server()
        if binary is None:
            print(f"skip: no llama-server found (set {ENV_VAR}=/path/to/llama-server or put it on PATH; "
                  "build it with scripts/build_llama_server.sh), and no --base-url given")
            return 0
    from bench_generate import wiki_index

    questions = load_question_set(args.question_set, limit=args.questions)
    index = wiki_index(args.index)
    server = args.base_url or f"{binary} (fresh per run, {args.max_in_flight} slots)"
    print(f"server: {server}; {len(questions)} questions of {args.question_set}, ReAct, "
          f"{args.max_in_flight} in flight, {args.max_new_tokens} new tokens; {load_average()}", flush=True)
    seconds: dict[str, list[float]] = {s: [] for s in SCHEDULES}
    records: dict[str, list[dict]] = {}
    for repeat in range(args.repeats):
        for schedule in SCHEDULES if repeat % 2 == 0 else tuple(reversed(SCHEDULES)):
            with server_for_run(args, binary) as base_url:
                took, records[schedule] = timed_run(base_url, args.model, schedule, questions, index, args)
            seconds[schedule].append(took)
            print(f"  repeat {repeat + 1} {schedule:>10}: {took:.1f} s, "
                  f"{60 * len(questions) / took:.1f} episodes/min; {load_average()}", flush=True)
    speed = {s: [60 * len(questions) / t for t in seconds[s]] for s in SCHEDULES}
    for s in SCHEDULES:
        print(f"{s:>10}: episodes/min {spread(speed[s])}")
    ratio = statistics.median(speed["continuous"]) / statistics.median(speed["rounds"])
    same, total = identical_share(records["rounds"], records["continuous"])
    print(f"continuous / rounds: {ratio:.2f}x episodes/min; identical records (last repeat): {same}/{total}; "
          f"{load_average()}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except PipelineError as exc:  # the reason and exit 2, as the pipeline's own commands do
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
