"""Real HTTP servers on 127.0.0.1 for tests: a fault-injecting base, a fake MediaWiki Action API
and a fake OpenAI-compatible endpoint built on it. No network: everything binds to loopback.

    with FakeMediaWiki(pages={"Milhouse": "Milhouse is ..."}) as wiki:
        wiki.inject(Fault("503"), Fault("drop"))   # the next two requests fail, then normal
        LiveWikipedia(api_url=wiki.api_url, ...).get_page("Milhouse")
        wiki.requests                                # every request the server saw

Fault kinds (FAULT_KINDS): "delay" (answer only after `delay_s`, past the client's timeout),
"429" (with `retry_after`), "500", "503", "truncated_json" (a complete HTTP answer whose JSON
body is cut in half), "invalid_json" (a 200 HTML page), "drop" (headers promise the full body,
half is sent, the connection is closed), "reset" (the connection is closed before any answer).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.parse
from collections import Counter, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULT_KINDS = ("delay", "429", "500", "503", "truncated_json", "invalid_json", "drop", "reset")


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):  # injected faults break sockets on purpose
        pass


@dataclass
class Fault:
    kind: str
    delay_s: float = 1.0  # "delay": how long to hold the answer
    retry_after: str | None = None  # "429": the Retry-After header value

    def __post_init__(self):
        if self.kind not in FAULT_KINDS and not self.kind.startswith("api:"):
            raise ValueError(f"unknown fault {self.kind!r}")


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any = None  # parsed JSON of a POST, when it was JSON
    fault: str | None = None  # the fault this request was answered with


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # JSON-serialisable
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None  # sent as is instead of `body` (e.g. a gzip-encoded answer)


class FaultyServer:
    """A threaded HTTP server in a background thread. Subclasses implement `answer(request)`;
    injected faults replace the answers of the next requests, in order."""

    def __init__(self, latency_s: float = 0.0, port: int = 0):
        self.latency_s = latency_s  # every normal answer waits this long (to overlap requests)
        self.requests: list[Recorded] = []
        self.outcomes: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self._faults: deque[Fault] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = _QuietServer(("127.0.0.1", port), _handler_for(self))  # 0: any free port
        self._server.daemon_threads = True
        # a short poll interval: shutdown() waits up to one interval, once per test
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,),
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def inject(self, *faults: Fault | str) -> None:
        with self._lock:
            self._faults.extend(f if isinstance(f, Fault) else Fault(f) for f in faults)

    def pending_faults(self) -> int:
        with self._lock:
            return len(self._faults)

    def next_fault(self, request: Recorded) -> Fault | None:
        with self._lock:
            return self._faults.popleft() if self._faults else None

    def answer(self, request: Recorded) -> Reply:
        raise NotImplementedError

    def api_fault(self, kind: str) -> Reply:
        """An application-level error answer ("api:<code>"); subclasses shape it."""
        return Reply(400, {"error": kind})

    def sleep(self, seconds: float) -> None:
        self._stopping.wait(seconds)  # returns at once when the server shuts down


def _handler_for(server: FaultyServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep pytest output clean
            pass

        def do_GET(self):
            self._serve()

        def do_POST(self):
            self._serve()

        def _serve(self):
            parts = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw
            request = Recorded(self.command, parts.path, query, dict(self.headers.items()), body)
            fault = server.next_fault(request)
            request.fault = fault.kind if fault else None
            with server._lock:
                server.requests.append(request)
                server.outcomes[request.fault or "ok"] += 1
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            self._counted = True
            try:
                self._respond(request, fault)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up first (a timeout): that is the point of the fault
            finally:
                self._leave()

        def _leave(self):
            # A request stops counting as in flight just before its answer is written: the
            # client cannot send its next request before reading this answer, so the count
            # never includes a finished request's tail (which would overstate concurrency).
            if getattr(self, "_counted", False):
                self._counted = False
                with server._lock:
                    server.in_flight -= 1

        def _respond(self, request: Recorded, fault: Fault | None):
            if fault is None or fault.kind == "delay":
                server.sleep(fault.delay_s if fault else server.latency_s)
                return self._send(server.answer(request))
            kind = fault.kind
            if kind == "reset":
                return self._abort()
            if kind == "429":
                headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                return self._send(Reply(429, {"error": {"message": "Too Many Requests"}}, headers))
            if kind in ("500", "503"):
                return self._send(Reply(int(kind), {"error": {"message": "server error"}}))
            if kind == "invalid_json":
                return self._write(200, b"<html><body>502 Bad Gateway</body></html>",
                                   {"Content-Type": "text/html"})
            if kind.startswith("api:"):
                return self._send(server.api_fault(kind[4:]))
            full = json.dumps(server.answer(request).body).encode()
            half = full[: max(1, len(full) // 2)]
            if kind == "truncated_json":
                return self._write(200, half, {"Content-Type": "application/json"})
            # "drop": promise the whole body, send half, close the connection
            self._leave()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(full)))
            self.end_headers()
            self.wfile.write(half)
            self.wfile.flush()
            self._abort()

        def _abort(self):
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def _send(self, reply: Reply):
            payload = reply.raw if reply.raw is not None else json.dumps(reply.body, ensure_ascii=False).encode("utf-8")
            self._write(reply.status, payload, {"Content-Type": "application/json",
                                                **reply.headers})

        def _write(self, status: int, payload: bytes, headers: dict[str, str]):
            self._leave()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler


# -- a fake MediaWiki Action API ---------------------------------------------------------------


def _mw_title(title: str) -> str:
    """MediaWiki's title normalisation: underscores are spaces, the first letter upper-case."""
    title = " ".join(title.replace("_", " ").split())
    return title[:1].upper() + title[1:]


class FakeMediaWiki(FaultyServer):
    """Answers action=query with prop=extracts (formatversion=2) and list=search like
    en.wikipedia.org does, from `pages` (title -> plain-text extract) and `redirects`."""

    def __init__(self, pages: dict[str, str], redirects: dict[str, str] | None = None,
                 latency_s: float = 0.0):
        super().__init__(latency_s)
        self.pages = pages
        self.redirects = redirects or {}

    @property
    def api_url(self) -> str:
        return f"{self.url}/w/api.php"

    def api_fault(self, code: str) -> Reply:
        return Reply(200, {"error": {"code": code, "info": f"simulated {code}"},
                           "servedby": "fake"}, {"Retry-After": "1"})

    def answer(self, request: Recorded) -> Reply:
        q = request.query
        if request.path != "/w/api.php" or q.get("action") != "query":
            return Reply(200, {"error": {"code": "badvalue", "info": "unsupported request"}})
        if q.get("format") != "json" or q.get("formatversion") != "2":
            return Reply(200, {"error": {"code": "badformat", "info": "want json v2"}})
        if "titles" in q:
            return Reply(200, self._extracts(q))
        if q.get("list") == "search":
            return Reply(200, self._search(q))
        return Reply(200, {"error": {"code": "badparams", "info": "nothing to do"}})

    def _extracts(self, q: dict[str, str]) -> dict:
        query: dict[str, Any] = {}
        pages = []
        for asked in q["titles"].split("|"):
            if not asked.strip() or re.search(r"[#<>\[\]{}]", asked):
                pages.append({"title": asked, "invalidreason": "invalid characters",
                              "invalid": True})
                continue
            title = _mw_title(asked)
            if title != asked:
                query.setdefault("normalized", []).append({"fromencoded": False, "from": asked,
                                                           "to": title})
            if q.get("redirects") and title in self.redirects:
                target = self.redirects[title]
                query.setdefault("redirects", []).append({"from": title, "to": target})
                title = target
            if title in self.pages:
                pages.append({"pageid": 1 + sorted(self.pages).index(title), "ns": 0,
                              "title": title, "extract": self.pages[title]})
            else:
                pages.append({"ns": 0, "title": title, "missing": True})
        query["pages"] = pages
        return {"batchcomplete": True, "query": query}

    def _search(self, q: dict[str, str]) -> dict:
        text, limit = q.get("srsearch", ""), int(q.get("srlimit", 10))
        if not text:
            return {"error": {"code": "missingparam", "info": "srsearch needed"}}
        if q.get("srwhat") == "nearmatch":
            titles = [t for t in sorted(self.pages) if t.lower() == text.strip().lower()][:1]
        else:
            words = set(re.findall(r"\w+", text.lower()))
            scored = []
            for title, extract in self.pages.items():
                score = 3 * len(words & set(re.findall(r"\w+", title.lower())))
                score += len(words & set(re.findall(r"\w+", extract.lower())))
                if score:
                    scored.append((-score, title))
            titles = [t for _, t in sorted(scored)][:limit]
        hits = [{"ns": 0, "title": t} for t in titles]
        return {"batchcomplete": True, "query": {"search": hits}}


# -- a fake OpenAI-compatible endpoint -------------------------------------------------------------


# What real OpenAI-compatible servers answer (HTTP 400) to a request that does not fit their
# context window, word for word from their sources:
#  - vLLM, OpenAIServing._validate_input: a prompt of n_ctx tokens or more, or a prompt that
#    fits but leaves no room for max_tokens; the body is its ErrorResponse (recent releases nest
#    it under "error"; older ones put the fields at the top level with "object": "error").
#  - llama.cpp's llama-server: a prompt of n_ctx tokens or more (exceed_context_size_error, with
#    both counts in the body). It does not check max_tokens: generation stops at the window.
OVERFLOW_STYLES = ("vllm", "vllm-legacy", "llama.cpp")


def context_overflow(style: str, n_prompt: int, max_tokens: int, n_ctx: int) -> dict | None:
    """The error body `style` answers with, or None when the request fits."""
    if style == "llama.cpp":
        if n_prompt < n_ctx:
            return None
        return {"error": {"code": 400, "message": f"request ({n_prompt} tokens) exceeds the available context "
                          f"size ({n_ctx} tokens), try increasing it", "type": "exceed_context_size_error",
                          "n_prompt_tokens": n_prompt, "n_ctx": n_ctx}}
    if n_prompt >= n_ctx:
        message = (f"This model's maximum context length is {n_ctx} tokens. However, your request has "
                   f"{n_prompt} input tokens. Please reduce the length of the input messages.")
    elif n_prompt + max_tokens > n_ctx:
        message = (f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                   f"context length is {n_ctx} tokens and your request has {n_prompt} input tokens "
                   f"({max_tokens} > {n_ctx} - {n_prompt}).")
    else:
        return None
    error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    return {"object": "error", **error} if style == "vllm-legacy" else {"error": error}


class FakeOpenAI(FaultyServer):
    """/v1/models, /v1/completions and /v1/chat/completions like `vllm serve`. A "token" is a
    whitespace-separated word. `replies[prompt]` lists the texts of the choices (cycled); any
    other prompt gets "sample {i}: {last line of prompt}". `honour_stop=False` makes it ignore
    stop strings (some servers do); `prompt_faults[substring]` fails requests whose prompt
    contains it, whatever the order they arrive in."""

    def __init__(self, model: str = "fake-model", api_key: str | None = None,
                 latency_s: float = 0.0, honour_stop: bool = True, owned_by: str | None = None, port: int = 0):
        super().__init__(latency_s, port)
        self.model = model
        self.owned_by = owned_by  # "vllm": /v1/models says so, as `vllm serve` does; None: no such field
        self.api_key = api_key
        self.honour_stop = honour_stop
        self.replies: dict[str, list[str]] = {}
        self.prompt_faults: dict[str, deque[Fault]] = {}
        self.usage = True  # False: answers carry no usage block (some servers omit it)
        # A context window (in words) answered like a real server when a request does not fit
        # (see context_overflow); None: no limit.
        self.context_window: int | None = None
        self.overflow_style = "vllm"
        self.max_choices: int | None = None  # answer with at most this many choices, whatever `n` asks
        self.finish_reason: str | None = None  # every choice's finish_reason, in place of stop/length

    def api_fault(self, code: str) -> Reply:
        """"api:no_choices": a 200 without choices; "api:bad_usage": usage that is not a number."""
        if code == "no_choices":
            return Reply(200, {"object": "list", "data": []})
        if code == "bad_usage":
            return Reply(200, {"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}],
                               "usage": {"prompt_tokens": "many", "completion_tokens": 1}})
        return Reply(400, {"error": {"message": code}})

    def fail_prompt(self, substring: str, *faults: Fault | str) -> None:
        with self._lock:
            queue = self.prompt_faults.setdefault(substring, deque())
            queue.extend(f if isinstance(f, Fault) else Fault(f) for f in faults)

    def next_fault(self, request: Recorded) -> Fault | None:
        prompt = self._prompt(request.body) if isinstance(request.body, dict) else ""
        with self._lock:
            for substring, queue in self.prompt_faults.items():
                if queue and substring in (prompt or ""):
                    return queue.popleft()
        return super().next_fault(request)

    def answer(self, request: Recorded) -> Reply:
        if self.api_key is not None:
            given = request.headers.get("Authorization", "")
            if given != f"Bearer {self.api_key}":
                # Real providers echo (part of) the key they refused: the client must redact it.
                return Reply(401, {"error": {"message": f"Incorrect API key provided: "
                                             f"{given.removeprefix('Bearer ')}",
                                             "type": "invalid_request_error"}})
        if request.method == "GET" and request.path == "/v1/models":
            entry = {"id": self.model, "object": "model"} | ({"owned_by": self.owned_by} if self.owned_by else {})
            return Reply(200, {"object": "list", "data": [entry]})
        if request.method == "POST" and request.path in ("/v1/completions",
                                                         "/v1/chat/completions"):
            return self._generate(request.body, chat=request.path.endswith("chat/completions"))
        return Reply(404, {"error": {"message": f"no route {request.method} {request.path}"}})

    @staticmethod
    def _prompt(body: dict) -> str | None:
        if "messages" in body:
            return body["messages"][-1].get("content")
        return body.get("prompt")

    def _generate(self, body: Any, *, chat: bool) -> Reply:
        if not isinstance(body, dict) or body.get("model") != self.model:
            model = body.get("model") if isinstance(body, dict) else None
            return Reply(404, {"error": {"message": f"The model `{model}` does not exist."}})
        prompt = self._prompt(body)
        if not isinstance(prompt, str):
            return Reply(400, {"error": {"message": "prompt must be a string"}})
        if "CONTEXT_OVERFLOW" in prompt:
            return Reply(400, {"error": {"message": "This model's maximum context length is "
                                         "2048 tokens. However, you requested 9000 tokens."}})
        n, max_tokens = int(body.get("n", 1)), int(body.get("max_tokens", 16))
        if self.context_window is not None:
            error = context_overflow(self.overflow_style, len(prompt.split()), max_tokens, self.context_window)
            if error is not None:
                return Reply(400, error)
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        scripted = self.replies.get(prompt)
        choices, used = [], 0
        for i in range(n):
            text = scripted[i % len(scripted)] if scripted else \
                f"sample {i}: {prompt.splitlines()[-1] if prompt else ''}"
            text, finish = self._limit(text, stop, max_tokens)
            used += len(text.split())
            content = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            choices.append({"index": i, **content, "finish_reason": self.finish_reason or finish})
        choices = choices[:self.max_choices]
        reply = {"id": "cmpl-fake", "object": "chat.completion" if chat else "text_completion",
                 "model": self.model, "choices": list(reversed(choices))}  # order by "index"
        if self.usage:
            reply["usage"] = {"prompt_tokens": len(prompt.split()), "completion_tokens": used,
                              "total_tokens": len(prompt.split()) + used}
        return Reply(200, reply)

    def _limit(self, text: str, stop: list[str], max_tokens: int) -> tuple[str, str]:
        if self.honour_stop:
            cuts = [text.find(s) for s in stop if s and s in text]
            if cuts:
                return text[: min(cuts)], "stop"
        words = text.split(" ")
        if len(words) > max_tokens:
            return " ".join(words[:max_tokens]), "length"
        return text, "stop"


def wait_until(predicate, timeout_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()
