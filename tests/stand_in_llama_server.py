"""STAND-IN for llama.cpp's `llama-server`, for tests of bench/bench_server.py only: it takes the
flags the benchmark passes (-m, --host, --port, --alias, -np, -c, --threads), answers /health with
503 while it "loads" and 200 after, and serves /v1/models and /v1/completions with the scripted
teacher of episode_testdata (search the first gold title, then finish with the gold answer) for
a question set, after a latency that differs per question. It is not a model and batches nothing.

    python tests/stand_in_llama_server.py -m any.gguf --port 8080 --alias smollm2
    STAND_IN_NEVER_HEALTHY=1 ...   # /health never says 200 (a server stuck loading)
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from episode_testdata import ScriptedTeacher  # noqa: E402
from http_servers import FakeOpenAI, Reply  # noqa: E402

from pipeline.tasks.hotpotqa.questions import load_question_set  # noqa: E402

LOADING_S = 0.3


class StandInLlamaServer(FakeOpenAI):
    def __init__(self, alias: str, port: int, questions: list):
        super().__init__(model=alias)
        self._server.server_close()  # FakeOpenAI bound a free port; rebind where we were told
        from http_servers import _handler_for, _QuietServer

        self._server = _QuietServer(("127.0.0.1", port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)
        self.replies = ScriptedTeacher(questions)
        self.started = time.monotonic()
        self.never_healthy = os.environ.get("STAND_IN_NEVER_HEALTHY") == "1"

    def answer(self, request):
        if request.path == "/health":
            loading = self.never_healthy or time.monotonic() - self.started < LOADING_S
            return Reply(503, {"error": {"code": 503, "message": "Loading model"}}) if loading \
                else Reply(200, {"status": "ok"})
        if request.path == "/v1/completions" and isinstance(request.body, dict):
            # 10, 40 or 160 ms by question: the episodes' requests take different times
            self.sleep(0.01 * 4 ** (zlib.crc32(str(request.body.get("prompt"))[-200:].encode()) % 3))
        return super().answer(request)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("-a", "--alias", default=None)
    p.add_argument("-np", "--parallel", type=int, default=1)
    p.add_argument("-c", "--ctx-size", type=int, default=0)
    p.add_argument("-t", "--threads", type=int, default=-1)
    p.add_argument("--question-set", default=os.environ.get("STAND_IN_QUESTION_SET", "offline-eval"))
    args = p.parse_args()
    if not Path(args.model).is_file():
        sys.exit(f"error: failed to load model '{args.model}'")
    with StandInLlamaServer(args.alias or args.model, args.port, load_question_set(args.question_set)):
        threading.Event().wait()  # until terminated


if __name__ == "__main__":
    main()
