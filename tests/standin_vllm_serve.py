"""A STAND-IN for `vllm serve` (it is not vLLM and loads no model), for the managed-server
lifecycle tests: started by pipeline/llm/serving.py as `serve.command`, it takes `vllm serve`'s
arguments (the model first, --host, --port, --served-model-name, --enable-lora, --lora-modules
NAME=PATH, --max-lora-rank; other flags are accepted and ignored) and answers like it on
127.0.0.1: GET /health (200, or 503 while "loading"), GET /v1/models (the served name and each
LoRA module), POST /v1/completions and /v1/chat/completions (tests/http_servers.FakeOpenAI).

Faults and records for the tests, as extra flags (`serve.extra_args`):
  --standin-questions FILE     answer as tests/episode_testdata.ScriptedTeacher over these questions
  --standin-never-healthy      /health answers 503 forever
  --standin-die-after N        exit (code 3) at the N+1-th completion request, without answering it
  --standin-die-file FILE      the same, with N read from FILE when it exists (so that a test can
                               make one run die and the next not, under one config)
  --standin-ignore-sigterm     only SIGKILL stops it
  --standin-child              start a child that, like vLLM's engine core, has no parent-death
                               signal and outlives this process when it is killed
  --standin-record FILE        append {"argv": ..., "pid": ..., "omp_bind": ...} once and {"model": ..., "in_flight": ...} per
                               completion request (in_flight: the requests the server holds, this one included)
  --standin-latency S          hold each answer S seconds (so that requests in flight overlap, as on a busy server)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from http_servers import FakeOpenAI, Recorded, Reply, _handler_for, _QuietServer  # noqa: E402


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="standin_vllm_serve")
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name")
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--lora-modules", nargs="*", default=[])
    parser.add_argument("--max-lora-rank", type=int)
    parser.add_argument("--standin-questions")
    parser.add_argument("--standin-never-healthy", action="store_true")
    parser.add_argument("--standin-die-after", type=int)
    parser.add_argument("--standin-die-file")
    parser.add_argument("--standin-ignore-sigterm", action="store_true")
    parser.add_argument("--standin-child", action="store_true")
    parser.add_argument("--standin-record")
    parser.add_argument("--standin-latency", type=float, default=0.0)
    args, _ = parser.parse_known_args(argv)  # vLLM's other flags (--dtype, ...) mean nothing here
    if args.standin_die_file and Path(args.standin_die_file).is_file():
        args.standin_die_after = int(Path(args.standin_die_file).read_text())
    return args


class _Listening(_QuietServer):
    # vLLM's server (uvicorn) queues 2048 connections; socketserver's default 5 would hold back
    # the sixth connection of a burst for a SYN retry (a second) and understate the requests in flight
    request_queue_size = 2048


class StandIn(FakeOpenAI):
    def __init__(self, args: argparse.Namespace):
        self.names = [args.served_model_name or args.model]
        for module in args.lora_modules:
            if not args.enable_lora:
                raise SystemExit("--lora-modules needs --enable-lora (as vLLM says)")
            name, _, path = module.partition("=")
            if not Path(path, "adapter_config.json").is_file():
                raise SystemExit(f"LoRA module {name}: no adapter_config.json in {path}")
            self.names.append(name)
        super().__init__(model=self.names[0])
        self._server.server_close()  # FakeOpenAI binds any port; vllm serve binds the one it is given
        self._server = _Listening((args.host, args.port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)
        self.args = args
        self.completions = 0
        self.latency_s = args.standin_latency
        if args.standin_questions:
            from episode_testdata import ScriptedTeacher

            from pipeline.tasks.hotpotqa.questions import load_question_set

            self.replies = ScriptedTeacher(load_question_set(args.standin_questions))
        child = None
        if args.standin_child:
            import subprocess

            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]).pid
        self.record({"argv": sys.argv[1:], "pid": os.getpid(), "child": child,
                     "omp_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")})

    def record(self, entry: dict) -> None:
        if self.args.standin_record:
            with open(self.args.standin_record, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry) + "\n")

    def answer(self, request: Recorded) -> Reply:
        if request.method == "GET" and request.path == "/health":
            return Reply(503 if self.args.standin_never_healthy else 200, {})
        if request.method == "GET" and request.path == "/v1/models":
            return Reply(200, {"object": "list", "data": [{"id": n, "object": "model"} for n in self.names]})
        if request.method == "POST" and isinstance(request.body, dict):
            with self._lock:
                self.completions += 1
                if self.args.standin_die_after is not None and self.completions > self.args.standin_die_after:
                    os._exit(3)  # a crash: no answer, no cleanup
                # Recorded under the lock: a request counted here but recorded after the lock was
                # released could be lost to a concurrent request's os._exit (the record short by one).
                self.record({"model": request.body.get("model"), "in_flight": self.in_flight})
            if request.body.get("model") in self.names:  # the base or a LoRA: both answer here
                request.body = {**request.body, "model": self.model}
        return super().answer(request)


def main() -> None:
    args = parse(sys.argv[1:])
    if args.standin_ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    server = StandIn(args)
    print(f"stand-in vllm serve: {server.names} on {args.host}:{args.port}", flush=True)
    server._thread.start()
    threading.Event().wait()  # until a signal ends the process


if __name__ == "__main__":
    main()
