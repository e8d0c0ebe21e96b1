"""The shared JSON-over-HTTP client against a real fault-injecting server on 127.0.0.1.

    .venv/bin/python -m pytest tests/test_http.py -q
"""

from __future__ import annotations

import email.utils
import gzip
import json
import logging
import random
import re
import socket
import time

import pytest
from http_servers import FAULT_KINDS, Fault, FaultyServer, Recorded, Reply

from pipeline import __version__
from pipeline.core.transport import (
    USER_AGENT,
    JsonHttpClient,
    PermanentPayload,
    RequestFailed,
    TransientPayload,
    _decode_json,
)

TIMEOUT_S = 0.25  # the "delay" fault holds its answer for 1 s, well past this


class EchoServer(FaultyServer):
    """Answers every request with JSON describing it; /status/<code> answers that status."""

    def answer(self, request: Recorded) -> Reply:
        if request.path.startswith("/status/"):
            code = int(request.path.rsplit("/", 1)[1])
            # echo the Authorization header, as some providers do with a refused key
            return Reply(code, {"error": {"message": request.headers.get("Authorization", "")}})
        return Reply(200, {"path": request.path, "query": request.query, "body": request.body,
                           "text": "naïve café 東京"})


@pytest.fixture
def server():
    with EchoServer() as s:
        yield s


def make_client(sleeps: list[float] | None = None, **kw) -> JsonHttpClient:
    kw.setdefault("timeout_s", TIMEOUT_S)
    kw.setdefault("max_retries", 3)
    return JsonHttpClient(backoff_base_s=0.01, backoff_max_s=0.05,
                          sleep=(sleeps.append if sleeps is not None else lambda s: None),
                          rng=random.Random(0), **kw)


def test_get_and_post_round_trip_json_with_user_agent(server):
    client = make_client()
    got = client.get_json(f"{server.url}/x", {"q": "Zürich", "n": 2})
    assert got == {"path": "/x", "query": {"q": "Zürich", "n": "2"}, "body": None,
                   "text": "naïve café 東京"}
    posted = client.post_json(f"{server.url}/y", {"prompt": "héllo", "n": 3})
    assert posted["body"] == {"prompt": "héllo", "n": 3}
    ua = server.requests[0].headers["User-Agent"]
    assert ua == USER_AGENT
    assert re.fullmatch(rf"react-finetune-pipeline/{re.escape(__version__)} \(research; \+\S+\)", ua)
    assert server.requests[1].headers["Content-Type"] == "application/json"


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_fault_is_retried_then_succeeds(server, kind):
    server.inject(Fault(kind, retry_after="0"), Fault(kind, retry_after="0"))
    sleeps: list[float] = []
    got = make_client(sleeps).get_json(f"{server.url}/ok")
    assert got["path"] == "/ok"
    assert [r.fault for r in server.requests] == [kind, kind, None]
    assert len(sleeps) == 2


@pytest.mark.parametrize("kind,expected", [
    ("delay", "timed out after 0.25 s"),
    ("429", "HTTP 429"),
    ("500", "HTTP 500"),
    ("503", "HTTP 503"),
    ("truncated_json", "truncated JSON"),
    ("invalid_json", "invalid JSON"),
    ("drop", "connection dropped mid-response"),
    ("reset", "connection failed"),
])
def test_retries_are_bounded_and_the_reason_is_one_line(server, kind, expected):
    server.inject(*[Fault(kind, retry_after="0")] * 10)
    with pytest.raises(RequestFailed) as info:
        make_client(max_retries=2).get_json(f"{server.url}/never")
    reason = info.value.reason
    assert "\n" not in reason and expected in reason
    assert "gave up after 3 attempts" in reason
    assert len(server.requests) == 3  # max_retries + 1, then it stops asking
    assert server.pending_faults() == 7


def test_retry_after_is_honoured_and_capped(server):
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    server.inject(Fault("429", retry_after="7"), Fault("429", retry_after="1000"),
                  Fault("429", retry_after=future), Fault("429"))
    sleeps: list[float] = []
    make_client(sleeps, max_retries=5, retry_after_max_s=20.0).get_json(f"{server.url}/")
    assert sleeps[0] == pytest.approx(7.0)
    assert sleeps[1] == 20.0  # capped
    assert 20.0 >= sleeps[2] >= 20.0 - 1  # an HTTP date ~30 s ahead, capped to 20
    assert sleeps[3] < 0.06  # no header: plain backoff
    assert len(server.requests) == 5


def test_backoff_grows_exponentially_with_jitter_and_a_cap(server):
    server.inject(*["500"] * 6)
    sleeps: list[float] = []
    client = JsonHttpClient(timeout_s=TIMEOUT_S, max_retries=6, backoff_base_s=1.0,
                            backoff_max_s=8.0, sleep=sleeps.append, rng=random.Random(1))
    client.get_json(f"{server.url}/")
    ceilings = [1, 2, 4, 8, 8, 8]
    assert len(sleeps) == 6
    for delay, ceiling in zip(sleeps, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert len(set(sleeps)) == 6  # jittered, not a fixed schedule


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_other_4xx_fail_at_once(server, status):
    sleeps: list[float] = []
    with pytest.raises(RequestFailed) as info:
        make_client(sleeps).get_json(f"{server.url}/status/{status}")
    assert info.value.reason.startswith(f"GET {server.url}/status/{status}: HTTP {status}")
    assert len(server.requests) == 1 and sleeps == []


def test_408_is_retried_like_a_timeout(server):
    with pytest.raises(RequestFailed, match="gave up after 2 attempts; last: HTTP 408"):
        make_client(max_retries=1).get_json(f"{server.url}/status/408")
    assert len(server.requests) == 2


def test_connection_refused_is_retried_then_reported():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps: list[float] = []
    with pytest.raises(RequestFailed, match=r"gave up after 3 attempts; last: connection failed"):
        make_client(sleeps, max_retries=2).get_json(f"http://127.0.0.1:{port}/v1/models")
    assert len(sleeps) == 2


def test_a_secret_never_appears_in_reasons_logs_or_repr(server, caplog):
    key = "sk-PLANTED-0123456789abcdef"
    client = make_client(headers={"Authorization": f"Bearer {key}"}, secrets=[key])
    caplog.set_level(logging.DEBUG)
    with pytest.raises(RequestFailed) as info:  # 401 echoing the key back
        client.get_json(f"{server.url}/status/401")
    assert server.requests[0].headers["Authorization"] == f"Bearer {key}"
    assert key not in str(info.value) and "Bearer ***" in str(info.value)
    with pytest.raises(RequestFailed) as info:  # 503 echoing it, retried (logged), exhausted
        client.get_json(f"{server.url}/status/503")
    assert "gave up" in str(info.value)
    assert key not in str(info.value) and key not in repr(info.value)
    assert "retry 1/3" in caplog.text and key not in caplog.text
    assert key not in repr(client)


def test_a_secret_near_a_cut_point_is_redacted_before_cutting():
    key = "sk-PLANTED-0123456789abcdef"
    body = ("x" * 50 + key).encode()  # the 60-character head would cut the key in half
    client = make_client(secrets=[key])
    with pytest.raises(Exception, match="invalid JSON") as info:
        _decode_json(body, "", client.redact)
    assert "sk-PLANTED" not in str(info.value) and "***" in str(info.value)


def test_check_callback_retries_transient_and_stops_on_permanent(server):
    seen = []

    def transient_twice(payload):
        seen.append(payload)
        if len(seen) <= 2:
            raise TransientPayload("lagged")

    assert make_client().get_json(f"{server.url}/a", check=transient_twice)["path"] == "/a"
    assert len(server.requests) == 3

    def permanent(payload):
        raise PermanentPayload("API error nosuchthing: no")

    with pytest.raises(RequestFailed, match=r"/b: API error nosuchthing: no$"):
        make_client().get_json(f"{server.url}/b", check=permanent)
    assert len(server.requests) == 4


def test_a_malformed_url_fails_at_once():
    with pytest.raises(RequestFailed, match="invalid request"):
        make_client().get_json("http://127.0.0.1:notaport/x")


class GzipServer(FaultyServer):
    """Answers gzip-encoded JSON; the first `cut` answers lose their last 8 bytes (the gzip
    trailer) on the way, as when a proxy or a dropped connection cuts a body short."""

    def __init__(self, cut: int):
        super().__init__()
        self.cut = cut

    def answer(self, request: Recorded) -> Reply:
        body = gzip.compress(json.dumps({"a": "ü"}).encode())
        if len(self.requests) <= self.cut:
            body = body[:-8]
        return Reply(200, raw=body, headers={"Content-Encoding": "gzip"})


def test_gzip_bodies_are_decoded_and_a_cut_gzip_is_retried_as_transient():
    with GzipServer(cut=1) as server:  # cut once, then whole: retried, then decoded
        sleeps: list[float] = []
        assert make_client(sleeps).get_json(f"{server.url}/z") == {"a": "ü"}
        assert len(server.requests) == 2 and len(sleeps) == 1
    with GzipServer(cut=10) as server:  # cut every time: retried until the attempts run out
        with pytest.raises(RequestFailed, match="gave up after 3 attempts; last: truncated gzip body"):
            make_client(max_retries=2).get_json(f"{server.url}/z")
        assert len(server.requests) == 3


def test_bad_settings_are_refused():
    with pytest.raises(Exception, match="timeout_s must be > 0"):
        JsonHttpClient(timeout_s=0)
    with pytest.raises(Exception, match="max_retries must be >= 0"):
        JsonHttpClient(max_retries=-1)


def test_a_slow_answer_is_waited_for_while_the_server_is_still_working(server):
    """`still_working` (set for a server the pipeline manages): a slow answer is not re-sent while
    it says yes, each timeout; once it says no, the wait ends as a timeout (and is retried)."""
    asked: list[float] = []
    client = make_client(timeout_s=0.2, max_retries=0)
    client.still_working = lambda: asked.append(time.monotonic()) or True
    server.inject(Fault("delay", delay_s=1.0))
    assert client.post_json(f"{server.url}/slow", {"n": 1})["path"] == "/slow"
    assert len(server.requests) == 1 and len(asked) >= 3  # asked each 0.2 s, never re-sent

    client.still_working = lambda: False
    server.inject(Fault("delay", delay_s=1.0))
    with pytest.raises(RequestFailed, match="timed out"):
        client.post_json(f"{server.url}/slow", {"n": 2})
    assert len(server.requests) == 2


def test_a_local_server_is_reached_directly_whatever_http_proxy_says(monkeypatch, tmp_path):
    """A cluster node often sets http_proxy (for the hub) and no no_proxy for 127.0.0.1: the
    client and a managed server's health probe (pipeline/llm/serving.py) must still reach a local
    server, not send its requests to the proxy (here a port where nothing listens)."""
    import urllib.request

    from http_servers import FakeOpenAI

    from pipeline.llm.serving import ServerView

    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(urllib.request, "_opener", None)  # urlopen's cached opener reads the proxy anew
    with FakeOpenAI(model="m") as server:
        assert JsonHttpClient(max_retries=0).get_json(f"{server.url}/v1/models")["data"][0]["id"] == "m"
        host, port = server.url.removeprefix("http://").split(":")
        status, body = ServerView(host, int(port), tmp_path / "log")._get("/v1/models")
        assert status == 200 and b'"m"' in body
        assert len(server.requests) == 2
