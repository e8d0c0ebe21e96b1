"""A small JSON-over-HTTP client shared by the live Wikipedia backend and the OpenAI-compatible
LLM backend: timeouts, bounded retries with exponential backoff and jitter, and one-line errors.

Standard library only (urllib), so the project adds no dependency for it.

What is retried (each costs one attempt of `max_retries + 1`):
  - HTTP 429 (waits at least its Retry-After, capped), 408 and every 5xx;
  - a timeout, a refused / reset / dropped connection, a response cut short mid-body;
  - a 200 whose body is truncated or is not JSON (a proxy's HTML error page, a torn write);
  - a payload the caller's `check` marks as transient (e.g. MediaWiki's `maxlag` error).
Any other 4xx fails at once: asking again would get the same answer.

A timeout is not always a reason to ask again: a server that is still computing the answer (a
busy vLLM with many requests in flight) would then compute it twice, and a slow server would
turn into a retry storm. With `still_working` set (a callable: is the server that has the
request alive and healthy?), each `timeout_s` without an answer asks it, and while it says yes
the client keeps waiting for the same answer instead of re-sending (pipeline/llm/serving.py sets it
for a server the pipeline manages, whose process it watches).

When the attempts run out (or on a permanent error) `RequestFailed` is raised with a one-line
reason. Secrets (API keys) given to the client are redacted from every reason and log line.

    client = JsonHttpClient(timeout_s=10, max_retries=4)
    payload = client.get_json("https://en.wikipedia.org/w/api.php", {"action": "query", ...})
"""

from __future__ import annotations

import email.utils
import gzip
import http.client
import json
import logging
import random
import select
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from pipeline import __version__
from pipeline.core.errors import BackendFailure, PipelineError

log = logging.getLogger(__name__)

REPO_URL = "https://github.com/<owner>/react-finetune-pipeline"  # placeholder until published
USER_AGENT = f"react-finetune-pipeline/{__version__} (research; +{REPO_URL})"

RETRYABLE_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))
# This machine: 0.0.0.0 too (a server told to listen on every interface is reached there)
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})


class RequestFailed(BackendFailure):
    """A request that failed for good (retries exhausted, or a permanent error such as HTTP 404).

    Callers that run many episodes catch it and record `reason` on the one episode; uncaught,
    the CLI prints it as a one-line error. `exhausted` says the attempts ran out on errors worth
    retrying (the server or the connection is the trouble, not the request itself)."""

    def __init__(self, reason: str, *, exhausted: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.exhausted = exhausted


class TransientPayload(Exception):
    """Raised by a `check` callback: the payload is an error worth asking again for."""


class PermanentPayload(Exception):
    """Raised by a `check` callback: the payload is an error that asking again will not fix."""


class _Attempt(Exception):
    """One failed attempt: `retry` says whether another attempt may succeed."""

    def __init__(self, reason: str, *, retry: bool, retry_after_s: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.retry = retry
        self.retry_after_s = retry_after_s


class JsonHttpClient:
    """GET / POST JSON with timeouts and bounded, jittered retries.

    `sleep` and `rng` are injectable so tests run the whole retry schedule without waiting.
    `secrets` are strings (API keys) that must never appear in a reason or a log line."""

    def __init__(
        self,
        *,
        timeout_s: float = 30.0,
        max_retries: int = 5,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        retry_after_max_s: float = 60.0,
        headers: Mapping[str, str] | None = None,
        secrets: list[str] | None = None,
        user_agent: str = USER_AGENT,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ):
        if timeout_s <= 0:
            raise PipelineError(f"timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise PipelineError(f"max_retries must be >= 0, got {max_retries}")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.retry_after_max_s = retry_after_max_s
        self._headers = {"User-Agent": user_agent, "Accept": "application/json",
                         "Accept-Encoding": "gzip", **(headers or {})}
        self._secrets = [s for s in (secrets or []) if s]
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.still_working: Callable[[], bool] | None = None  # see the module docstring
        self._opener_for = openers(_PatientHTTPHandler(lambda: self.still_working))

    def __repr__(self) -> str:  # headers may hold a key: never show them
        return f"JsonHttpClient(timeout_s={self.timeout_s}, max_retries={self.max_retries})"

    # -- public ---------------------------------------------------------------------------

    def get_json(self, url: str, params: Mapping[str, Any] | None = None, *,
                 check: Callable[[Any], None] | None = None) -> Any:
        full = url + ("?" + urllib.parse.urlencode(params) if params else "")
        return self.request_json("GET", full, check=check, label=f"GET {url}")

    def post_json(self, url: str, body: Any, *,
                  check: Callable[[Any], None] | None = None) -> Any:
        return self.request_json("POST", url, body=body, check=check, label=f"POST {url}")

    def request_json(self, method: str, url: str, *, body: Any = None,
                     check: Callable[[Any], None] | None = None, label: str | None = None) -> Any:
        """Send the request until it yields JSON (that passes `check`) or attempts run out."""
        label = self.redact(label or f"{method} {url}")
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            try:
                payload = self._once(method, url, body)
                if check is not None:
                    try:
                        check(payload)
                    except TransientPayload as e:
                        raise _Attempt(str(e), retry=True) from None
                    except PermanentPayload as e:
                        raise _Attempt(str(e), retry=False) from None
                return payload
            except _Attempt as failure:
                reason = self.redact(failure.reason)
                if not failure.retry:
                    raise RequestFailed(f"{label}: {reason}") from None
                if attempt + 1 == attempts:
                    raise RequestFailed(f"{label}: gave up after {attempts} attempts; last: {reason}",
                                        exhausted=True) from None
                delay = self._delay(attempt, failure.retry_after_s)
                log.warning("%s: %s; retry %d/%d in %.2f s", label, reason, attempt + 1,
                            self.max_retries, delay)
                self._sleep(delay)
        raise AssertionError("unreachable")

    def redact(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "***")
        return text

    # -- one attempt ----------------------------------------------------------------------

    def _once(self, method: str, url: str, body: Any) -> Any:
        data = None
        headers = dict(self._headers)
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with self._opener_for(url).open(request, timeout=self.timeout_s) as response:
                raw = response.read()
                encoding = response.headers.get("Content-Encoding", "")
        except urllib.error.HTTPError as e:
            raise self._status_failure(e) from None
        except TimeoutError:
            raise _Attempt(f"timed out after {self.timeout_s:g} s", retry=True) from None
        except urllib.error.URLError as e:
            why = e.reason
            if isinstance(why, TimeoutError):
                raise _Attempt(f"timed out after {self.timeout_s:g} s", retry=True) from None
            raise _Attempt(f"connection failed ({_one_line(why)})", retry=True) from None
        except http.client.IncompleteRead as e:
            raise _Attempt(f"connection dropped mid-response ({len(e.partial)} bytes read)",
                           retry=True) from None
        except (ValueError, http.client.InvalidURL) as e:  # a malformed URL: no retry helps
            raise _Attempt(f"invalid request ({_one_line(e)})", retry=False) from None
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            raise _Attempt(f"connection failed ({type(e).__name__}: {_one_line(e)})",
                           retry=True) from None
        return _decode_json(raw, encoding, self.redact)

    def _status_failure(self, e: urllib.error.HTTPError) -> _Attempt:
        try:
            # redact before cutting, so a cut can never leave part of a key behind
            snippet = self.redact(_one_line(e.read().decode("utf-8", "replace")))[:200]
        except Exception:  # the error body itself may be cut short; the status is what matters
            snippet = ""
        reason = f"HTTP {e.code}" + (f": {snippet}" if snippet else "")
        retry_after = _parse_retry_after(e.headers.get("Retry-After")) if e.headers else None
        return _Attempt(reason, retry=e.code in RETRYABLE_STATUS, retry_after_s=retry_after)

    def _delay(self, attempt: int, retry_after_s: float | None) -> float:
        """Exponential backoff with equal jitter; a server's Retry-After is a floor (capped)."""
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
        delay = ceiling / 2 + self._rng.uniform(0, ceiling / 2)
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, self.retry_after_max_s))
        return delay


def openers(*handlers: urllib.request.BaseHandler) -> Callable[[str], urllib.request.OpenerDirector]:
    """The urllib opener (with these handlers) to open a URL with: a local server (vllm serve, a
    test's fake) is reached directly, never through an environment proxy (a cluster's http_proxy
    for the hub often has no no_proxy for 127.0.0.1); any other host keeps urllib's proxy handling."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}), *handlers)
    default = urllib.request.build_opener(*handlers)
    return lambda url: direct if (urllib.parse.urlsplit(url).hostname or "") in _LOOPBACK else default


class _PatientHTTPHandler(urllib.request.HTTPHandler):
    """urllib's HTTP handler, whose connections wait for the response's first byte for as long as
    the client's `still_working()` (asked every `timeout_s`) says the server is on it."""

    def __init__(self, still_working: Callable[[], Callable[[], bool] | None]):
        super().__init__()
        self._still_working = still_working

    def http_open(self, req):
        check = self._still_working()
        if check is None:
            return super().http_open(req)
        return self.do_open(lambda *a, **kw: _PatientConnection(check, *a, **kw), req)


class _PatientConnection(http.client.HTTPConnection):
    def __init__(self, still_working: Callable[[], bool], *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._still_working = still_working

    def getresponse(self):
        """Before reading (with the usual timeout), wait until the answer starts to arrive,
        asking `still_working()` each `timeout` seconds; a dead server closes the connection,
        which also makes the socket readable."""
        if self.sock is not None and self.timeout is not None:
            while not select.select([self.sock], [], [], self.timeout)[0]:
                if not self._still_working():
                    raise TimeoutError("timed out, and the server is not healthy")
        return super().getresponse()


def _decode_json(raw: bytes, encoding: str, redact: Callable[[str], str] = str) -> Any:
    try:
        if encoding.lower() == "gzip":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error):
        raise _Attempt("truncated gzip body", retry=True) from None
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise _Attempt("response is not UTF-8 JSON", retry=True) from None
    except json.JSONDecodeError as e:
        text = e.doc.rstrip()
        cut_short = e.pos >= len(text) or e.msg.startswith("Unterminated")
        kind = "truncated JSON" if cut_short else "invalid JSON"
        head = redact(_one_line(raw))[:60]
        raise _Attempt(f"{kind} ({len(raw)} bytes: {head})", retry=True) from None


def _parse_retry_after(value: str | None) -> float | None:
    """Retry-After is either delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _one_line(value: object) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return " ".join(str(value).split())
