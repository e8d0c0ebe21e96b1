"""The live Wikipedia backend: the MediaWiki Action API behind the `WikiBackend` interface,
every successful answer cached on disk so a re-run sends no request at all.

    wiki = LiveWikipedia(cache_path="data/wiki/live-cache.sqlite")
    wiki.get_page("Colorado orogeny")        # Page(title=..., sentences=[...]) or None
    wiki.similar_titles("Adam Clayton Powell")  # up to 5 titles, Wikipedia's own search ranking

Configured as `wiki.backend=live` (see pipeline/wiki/config.py). The local index stays the
default: live pages change over time, so runs on it are not reproducible beyond the cache.

How a page becomes sentences, and why it copies the original ReAct `wikienv.py`:
the paper's model read observations made by splitting each paragraph with `p.split('. ')`,
so a live page is split the same way (not with a smarter sentence splitter) to give the model
the text it was prompted and trained on. The original scraped the HTML's <p>/<ul> blocks and
kept those of more than two words; here the plain-text extract is split into paragraphs on
newlines, section headings ("== History ==") are dropped (they were never in a <p>), and the
same more-than-two-words rule applies. The original then appended '.' to every piece, which
doubles the full stop of each paragraph's last sentence ("...Colorado.."); we restore only
the '.' that the split removed, so live and local observations end sentences the same way.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.core.transport import JsonHttpClient, PermanentPayload, TransientPayload
from pipeline.wiki.backend import Page, paragraph_sizes

DEFAULT_CACHE = Path("~/.cache/react-pipeline/live-wikipedia.sqlite")
_HEADING = re.compile(r"^=+[^=].*=+$")
# MediaWiki separates multiple values with '|'; such a title can never exist, so it is a miss
# answered without a request (sending it would silently query several pages).
_ILLEGAL_IN_TITLE = "|"
# API errors worth asking again for: replication lag, rate limit, a read-only moment, a crash.
_TRANSIENT_API_ERRORS = ("maxlag", "ratelimited", "readonly", "internal_api_error")


def split_sentences(text: str) -> list[str]:
    """Plain page text -> sentences, the way the original ReAct environment splits a page."""
    return [s for paragraph in split_paragraphs(text) for s in paragraph]


def split_paragraphs(text: str) -> list[list[str]]:
    """`split_sentences`, grouped by paragraph (kept so the original observation style can
    rebuild each paragraph: joining a paragraph's pieces with ' ' gives it back)."""
    paragraphs: list[list[str]] = []
    for line in text.split("\n"):
        paragraph = line.strip()
        if not paragraph or _HEADING.match(paragraph) or len(paragraph.split(" ")) <= 2:
            continue
        pieces = paragraph.split(". ")
        sentences = []
        for i, piece in enumerate(pieces):
            piece = piece.strip()
            if not piece:
                continue
            sentences.append(piece + "." if i < len(pieces) - 1 else piece)
        if sentences:
            paragraphs.append(sentences)
    return paragraphs


class ResponseCache:
    """A SQLite file of API answers keyed by the exact request parameters (thread-safe)."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
            self._db.execute("CREATE TABLE IF NOT EXISTS response (key TEXT PRIMARY KEY, "
                             "payload TEXT NOT NULL, fetched_at REAL NOT NULL)")
            self._db.commit()
        except sqlite3.DatabaseError as e:
            raise PipelineError(f"{self.path}: not a usable response cache ({e}); delete it or "
                                "set wiki.cache to another path") from None

    @staticmethod
    def key(api_url: str, params: dict[str, Any]) -> str:
        return json.dumps([api_url, sorted(params.items())], ensure_ascii=False)

    def get(self, key: str) -> Any | None:
        with self._lock:
            row = self._db.execute("SELECT payload FROM response WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: str, payload: Any) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO response VALUES (?, ?, ?)",
                             (key, json.dumps(payload, ensure_ascii=False), time.time()))
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM response").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()


class LiveWikipedia:
    """`WikiBackend` over the MediaWiki Action API (TextExtracts + CirrusSearch), cached.

    Raises `pipeline.core.transport.RequestFailed` (a PipelineError) when the API cannot be reached
    after the retries or answers with a permanent error; nothing is cached then."""

    def __init__(
        self,
        api_url: str = "https://en.wikipedia.org/w/api.php",
        cache_path: str | Path = DEFAULT_CACHE,
        timeout_s: float = 20.0,
        max_retries: int = 5,
        *,
        client: JsonHttpClient | None = None,
    ):
        if not api_url.startswith(("http://", "https://")):
            raise PipelineError(f"wiki.api_url '{api_url}' is not an http(s) URL; give the "
                                "api.php address, e.g. https://en.wikipedia.org/w/api.php")
        self.api_url = api_url
        self.cache = ResponseCache(cache_path)
        self.client = client or JsonHttpClient(timeout_s=timeout_s, max_retries=max_retries)
        self.requests_sent = 0  # answers not found in the cache

    def __repr__(self) -> str:
        return f"LiveWikipedia({self.api_url!r}, cache={str(self.cache.path)!r})"

    def get_page(self, entity: str) -> Page | None:
        """The page titled `entity` (redirects followed). Titles are case-sensitive except the
        first letter, so a miss falls back to Wikipedia's near-match (what its search box's
        "Go" does, and what the original environment got from it)."""
        entity = entity.strip()
        if not entity or _ILLEGAL_IN_TITLE in entity:
            return None
        page = self._extract(entity)
        if page is None:
            hits = self._search(entity, 1, what="nearmatch")
            if hits and hits[0] != entity:
                page = self._extract(hits[0])
        return page

    def similar_titles(self, entity: str, k: int = 5) -> list[str]:
        entity = entity.strip()
        if not entity or k <= 0:
            return []
        return self._search(entity, k, what="text")

    def close(self) -> None:
        self.cache.close()

    # -- API calls --------------------------------------------------------------------------

    def _extract(self, title: str) -> Page | None:
        payload = self._query({"prop": "extracts", "explaintext": 1, "exsectionformat": "wiki",
                               "redirects": 1, "titles": title})
        pages = payload.get("query", {}).get("pages", [])
        if not pages:
            return None
        page = pages[0]
        if page.get("missing") or page.get("invalid") or "extract" not in page:
            return None
        paragraphs = split_paragraphs(page["extract"])
        return Page(title=page["title"], sentences=[s for p in paragraphs for s in p],
                    paragraph_sizes=paragraph_sizes(paragraphs))

    def _search(self, text: str, k: int, *, what: str) -> list[str]:
        params = {"list": "search", "srsearch": text, "srlimit": k, "srnamespace": 0,
                  "srprop": "", "srinfo": ""}
        if what != "text":
            params["srwhat"] = what
        payload = self._query(params)
        return [hit["title"] for hit in payload.get("query", {}).get("search", [])][:k]

    def _query(self, params: dict[str, Any]) -> dict:
        params = {"action": "query", "format": "json", "formatversion": 2, **params}
        key = self.cache.key(self.api_url, params)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        self.requests_sent += 1
        payload = self.client.get_json(self.api_url, params, check=_check_api_payload)
        self.cache.put(key, payload)  # only answers that passed the check get here
        return payload


def _check_api_payload(payload: Any) -> None:
    """MediaWiki reports its own errors inside a 200 answer."""
    if not isinstance(payload, dict) or not isinstance(payload.get("query", {}), dict):
        raise TransientPayload("answer is not a MediaWiki query result")
    error = payload.get("error")
    if error is None:
        return
    code = str(error.get("code", "unknown"))
    info = " ".join(str(error.get("info", "")).split())[:200]
    if code.startswith(_TRANSIENT_API_ERRORS):
        raise TransientPayload(f"API error {code}: {info}")
    raise PermanentPayload(f"API error {code}: {info}")
