"""The local Wikipedia: one versioned SQLite file with exact title lookup and FTS5/BM25 ranking.

    python -m pipeline wiki build --corpus ../shared/data/wiki/corpus.jsonl --out data/wiki/hotpotqa-local.sqlite
    index = LocalIndex("data/wiki/hotpotqa-local.sqlite")
    index.get_page("milhouse_van_houten")        # -> Page | None (normalised exact title)
    index.similar_titles("Milhouse (film)", 5)   # -> titles ranked by BM25, titles weighted up
    index.retrieve("Which magazine was started first?", 3)  # -> Pages ranked by BM25 (the retriever)

Layout of the file (INDEX_FORMAT):
- `pages(id, title, key, sentences, paragraphs)`: `key` = `title_key(title)` (indexed),
  `sentences` = JSON list, `paragraphs` = JSON list of sentences per paragraph (NULL: one
  paragraph, as in an intro; the original observation style rebuilds paragraphs from it),
  `near` = `near_key(title)` (indexed);
- `redirects(key, near, target)`: from redirect sources (pipeline.wiki.corpus.read_redirects);
  `key` / `near` of the redirect's own title, `target` the title it points to;
- `pages_fts(title, body)`: a contentless FTS5 table (rowid = pages.id; BM25 needs only the
  index, and contentless is the fastest to build and the smallest), unicode61 tokenizer with
  diacritics removed, over NFKC-normalised title and sentence text;
- `term_df(term, df)`: document frequency of every term in at least `df_floor` pages (DF_FLOOR,
  or half the pages of a tiny corpus), used to leave out of a query the words too common to
  rank by (see `LocalIndex.similar_titles`); a term not listed is in fewer pages than that;
- `meta(key, value)`: format version, sources (path, size, mtime, sha256 of the first MiB,
  page counts), page count, skipped duplicates, build time, SQLite version, tokenizer.

Search order (`get_page`), like Wikipedia's "Go" box: the exact key; a redirect with that key
(one hop, as MediaWiki follows them); then the near-match key (`near_key`: diacritics removed, a
leading "The"/"A"/"An" dropped, on top of `title_key`) of a page, then of a redirect; otherwise
a miss.

Titles. `title_key` normalises for lookup: Unicode NFKC, case-fold, underscores to spaces,
whitespace collapsed and trimmed. Duplicates: the first page with a given exact title wins (the
order of --corpus, then file order); later ones are skipped and counted. Distinct titles that
share a key ("Cover version" / "Cover Version") are all kept, and `get_page` prefers the exact
title, then the title as Wikipedia would capitalise it (first letter upper-case), then the one
indexed first.

The build writes a temporary file beside the output with journaling and fsync off (safe: the
file is renamed into place only once complete, so nothing half-built is ever visible), inserts
in batches, and merges the FTS5 segments once at the end ('optimize').
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import quote

from pipeline.core.errors import PipelineError, os_error_message
from pipeline.core.storage import atomic_path
from pipeline.wiki.backend import Page, paragraph_sizes
from pipeline.wiki.corpus import (
    PAGE_SOURCES_HELP,
    REDIRECT_CONTAINERS,
    SourceStats,
    container_of,
    read_redirects,
    read_source,
)

INDEX_FORMAT = 2  # 2: paragraphs, near keys, redirects
TOKENIZER = "unicode61 remove_diacritics 2"
TITLE_WEIGHT, BODY_WEIGHT = 10.0, 1.0  # BM25 column weights: a title match counts 10x
DF_FLOOR = 32  # term_df keeps terms in at least this many pages (fewer in tiny corpora)
MAX_QUERY_CHARS = 2000  # longer Search text is cut before tokenising
MAX_QUERY_TOKENS = 32
MAX_TOKEN_CHARS = 64
POSTINGS_BUDGET = 5_000  # pages a similar-title query may score (~0.7 us each: ~3.5 ms)
# The retriever's query (`LocalIndex.retrieve`): the words of the text but these, OR'd
STOP_WORDS = frozenset("""a about after all also an and any are as at be been before being both but by can
could did do does during each either for from had has have he her hers him his how i if in into is it its
me more most my no nor not of on one or other our out over same she so some such than that the their them
then there these they this those through to too under up very was we were what when where which while who
whom whose why will with would you your""".split())
# What wiki.config.open_backend puts on a backend for every WikiEnv over it (kept across processes)
ENV_SETTINGS = ("observation_style", "search_mode", "search_k")
BUILD_HINT = "python -m pipeline wiki build --corpus PATH [PATH ...] --out INDEX"


def title_key(title: str) -> str:
    """The lookup form of a title: NFKC, case-folded, `_` -> space, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", title).casefold().replace("_", " ").split())


_LEADING_ARTICLE = re.compile(r"^(?:the|a|an) (?=\S)")


def near_key(title: str) -> str:
    """The near-match form: `title_key`, diacritics removed, a leading English article dropped
    ("The Beatles" ~ "beatles", "Pokémon" ~ "pokemon")."""
    return near_key_of(title_key(title))


def near_key_of(key: str) -> str:
    """`near_key` from a title's `title_key` (the build has it already)."""
    if not key.isascii():
        key = "".join(c for c in unicodedata.normalize("NFKD", key) if not unicodedata.combining(c))
    return _LEADING_ARTICLE.sub("", key) if key[:1] in "ta" else key


# ---------------------------------------------------------------- build


@dataclass
class BuildSettings:
    """How the file is written; `unoptimised()` is the bench's baseline (SQLite defaults, one
    INSERT per row, FTS5 merging as it goes). Measured on 300k synthetic pages the defaults save
    only ~5-10% CPU: the build is bound by FTS5 tokenising and JSON parsing, not by SQLite I/O."""

    batch_size: int = 5000
    bulk_pragmas: bool = True  # journal off, synchronous off, exclusive lock, big cache
    defer_fts_merge: bool = True  # automerge off while loading, one 'optimize' at the end

    @classmethod
    def unoptimised(cls) -> BuildSettings:
        return cls(batch_size=1, bulk_pragmas=False, defer_fts_merge=False)


@dataclass
class BuildStats:
    out: str
    pages: int
    duplicate_titles: int
    redirects: int = 0
    sources: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    df_floor: int = DF_FLOOR
    bytes: int = 0

    @property
    def pages_per_second(self) -> float:
        return self.pages / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "pages_per_second": round(self.pages_per_second, 1)}


_SCHEMA = f"""
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE pages(id INTEGER PRIMARY KEY, title TEXT NOT NULL, key TEXT NOT NULL, sentences TEXT NOT NULL,
                   paragraphs TEXT, near TEXT NOT NULL);
CREATE TABLE redirects(key TEXT NOT NULL, near TEXT NOT NULL, target TEXT NOT NULL);
CREATE VIRTUAL TABLE pages_fts USING fts5(title, body, tokenize='{TOKENIZER}', content='', detail=full);
CREATE TABLE term_df(term TEXT PRIMARY KEY, df INTEGER NOT NULL) WITHOUT ROWID;
"""
_BULK_PRAGMAS = (
    "journal_mode=OFF", "synchronous=OFF", "locking_mode=EXCLUSIVE", "temp_store=MEMORY",
    "cache_size=-262144",
)


def build_index(
    sources: Iterable[str | Path],
    out: str | Path,
    *,
    settings: BuildSettings | None = None,
    progress: Callable[[int], None] | None = None,
) -> BuildStats:
    """Index every page of `sources` (see pipeline.wiki.corpus for formats) into `out`, atomically.

    `progress(n)` is called with the number of pages added since its last call.
    Raises PipelineError for a missing or unreadable source, a page source without any page, or
    redirect sources alone (no page text at all).
    """
    settings = settings or BuildSettings()
    sources = check_sources(sources)
    out = Path(out)
    if out.is_dir():
        raise PipelineError(f"{out} is a folder; give the index a file path, e.g. {out / 'wiki.sqlite'}")
    started = time.perf_counter()
    try:
        with atomic_path(out) as tmp:
            db = sqlite3.connect(tmp, isolation_level=None)
            try:
                stats = _fill(db, sources, settings, progress)
                stats.seconds = time.perf_counter() - started
                _write_meta(db, stats)
            finally:
                db.close()
    except (OSError, sqlite3.Error) as exc:  # unreadable input, unwritable output, disk full
        reason = os_error_message(exc, out) if isinstance(exc, OSError) else exc
        raise PipelineError(f"building {out} failed: {reason}") from None
    stats.out, stats.bytes = str(out), out.stat().st_size
    stats.seconds = time.perf_counter() - started
    return stats


def check_sources(sources: Iterable[str | Path]) -> list[Path]:
    """Fail before any work on a missing source, one whose format is unknown, or redirect
    sources alone (an index without pages, where every Search would miss)."""
    paths = [Path(s) for s in sources]
    if not paths:
        raise PipelineError(f"no corpus given; run `{BUILD_HINT}`")
    for path in paths:
        if not path.exists():
            raise PipelineError(f"{path}: corpus file not found; check the path")
    containers = [container_of(path) for path in paths]  # each one's format known, or a one-line error
    if all(c in REDIRECT_CONTAINERS for c in containers):
        raise PipelineError(
            f"{', '.join(map(str, paths))}: no page text to index: a pages-articles XML dump (or a "
            "from<TAB>to .tsv) only adds redirects beside the pages of another source; give one that "
            f"holds page text too: {PAGE_SOURCES_HELP}")
    return paths


def _fill(db: sqlite3.Connection, sources: list[Path], settings: BuildSettings,
          progress: Callable[[int], None] | None) -> BuildStats:
    if settings.bulk_pragmas:
        for pragma in _BULK_PRAGMAS:
            db.execute(f"PRAGMA {pragma}")
    db.executescript(_SCHEMA)
    if settings.defer_fts_merge:
        db.execute("INSERT INTO pages_fts(pages_fts, rank) VALUES('automerge', 0)")
    stats = BuildStats(out="", pages=0, duplicate_titles=0)
    seen: set[str] = set()  # exact titles already indexed: the first one wins
    page_rows: list[tuple] = []
    fts_rows: list[tuple] = []
    page_id = 0

    def flush() -> None:
        db.executemany("INSERT INTO pages(id, title, key, sentences, paragraphs, near) VALUES(?, ?, ?, ?, ?, ?)",
                       page_rows)
        db.executemany("INSERT INTO pages_fts(rowid, title, body) VALUES(?, ?, ?)", fts_rows)
        if progress is not None:
            progress(len(page_rows))
        page_rows.clear()
        fts_rows.clear()

    db.execute("BEGIN")
    for source in sources:
        source_stats = SourceStats(str(source), container_of(source))
        if source_stats.container in REDIRECT_CONTAINERS:
            _add_redirects(db, source, source_stats)
            stats.redirects += source_stats.redirects
            stats.sources.append({**source_stats.to_dict(), **_fingerprint(source)})
            continue
        for title, paragraphs in read_source(source, source_stats):
            if title in seen:
                stats.duplicate_titles += 1
                continue
            seen.add(title)
            page_id += 1
            sentences = [s for p in paragraphs for s in p]
            sizes = paragraph_sizes(paragraphs)
            key = title_key(title)
            page_rows.append((page_id, title, key, _encode_json(sentences),
                              _encode_json(sizes) if sizes else None, near_key_of(key)))
            fts_rows.append((page_id, _fts_text(title), _fts_text(" ".join(sentences))))
            if len(page_rows) >= settings.batch_size:
                flush()
        if source_stats.pages == 0:
            raise PipelineError(
                f"{source}: no pages found (records read: {source_stats.records}, empty pages: "
                f"{source_stats.empty_pages}); is it a corpus file?"
            )
        stats.sources.append({**source_stats.to_dict(), **_fingerprint(source)})
    flush()
    db.execute("COMMIT")
    stats.pages = page_id
    stats.df_floor = max(1, min(DF_FLOOR, page_id // 2 + 1))  # unlisted terms are in <= half the pages
    _finish(db, settings, stats.df_floor)
    return stats


_encode_json = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps re-reads its options per call


def _add_redirects(db: sqlite3.Connection, source: Path, stats: SourceStats, batch: int = 20_000) -> None:
    rows: list[tuple[str, str, str]] = []
    for origin, target in read_redirects(source, stats):
        rows.append((title_key(origin), near_key(origin), target))
        if len(rows) >= batch:
            db.executemany("INSERT INTO redirects(key, near, target) VALUES(?, ?, ?)", rows)
            rows.clear()
    db.executemany("INSERT INTO redirects(key, near, target) VALUES(?, ?, ?)", rows)
    if stats.redirects == 0:
        raise PipelineError(f"{source}: no redirects found (records read: {stats.records}); is it a "
                            "pages-articles XML dump or a from<TAB>to redirect table?")


def _fts_text(text: str) -> str:
    # NFKC on both sides (index and query) so ligatures and full-width forms match
    return text if text.isascii() else unicodedata.normalize("NFKC", text)


def _finish(db: sqlite3.Connection, settings: BuildSettings, df_floor: int) -> None:
    db.execute("CREATE INDEX pages_key ON pages(key)")
    db.execute("CREATE INDEX pages_near ON pages(near)")
    db.execute("CREATE INDEX redirects_key ON redirects(key)")
    db.execute("CREATE INDEX redirects_near ON redirects(near)")
    if settings.defer_fts_merge:
        db.execute("INSERT INTO pages_fts(pages_fts) VALUES('optimize')")
    db.execute("CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, pages_fts, row)")
    db.execute("INSERT INTO term_df SELECT term, doc FROM temp.vocab WHERE doc >= ?", (df_floor,))
    db.execute("DROP TABLE temp.vocab")


def _fingerprint(path: Path) -> dict:
    """Size, mtime and a hash of the first MiB: cheap even for a multi-GB dump."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        return {"size": sum(p.stat().st_size for p in files), "files": len(files),
                "mtime": int(max((p.stat().st_mtime for p in files), default=0))}
    st = path.stat()
    with open(path, "rb") as fh:
        head = hashlib.sha256(fh.read(1 << 20)).hexdigest()
    return {"size": st.st_size, "mtime": int(st.st_mtime), "head_sha256": head}


def _write_meta(db: sqlite3.Connection, stats: BuildStats) -> None:
    meta = {
        "format": INDEX_FORMAT,
        "pages": stats.pages,
        "duplicate_titles": stats.duplicate_titles,
        "redirects": stats.redirects,
        "sources": stats.sources,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "build_seconds": round(stats.seconds, 2),
        "sqlite_version": sqlite3.sqlite_version,
        "tokenizer": TOKENIZER,
        "df_floor": stats.df_floor,
    }
    db.executemany("INSERT INTO meta(key, value) VALUES(?, ?)",
                   [(k, json.dumps(v, ensure_ascii=False)) for k, v in meta.items()])


def index_format(path: str | Path) -> int | None:
    """The format number an index file records, or None when it is not a readable index."""
    try:
        db = sqlite3.connect(f"file:{quote(str(Path(path).resolve()))}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        finally:
            db.close()
        return int(json.loads(row[0])) if row else None
    except (sqlite3.Error, ValueError, TypeError):
        return None


# ---------------------------------------------------------------- query


_TOKEN = re.compile(r"[^\W_]+")


def query_tokens(text: str) -> list[str]:
    """Distinct lower-cased words of `text`, in order, at most MAX_QUERY_TOKENS.

    Words are runs of letters and digits, as FTS5's unicode61 tokenizer cuts them, so no
    character of the user's text can act as FTS5 syntax.
    """
    text = _fts_text(text[:MAX_QUERY_CHARS]).lower()
    tokens: list[str] = []
    for token in _TOKEN.findall(text):
        token = token[:MAX_TOKEN_CHARS]
        if token not in tokens:
            tokens.append(token)
            if len(tokens) == MAX_QUERY_TOKENS:
                break
    return tokens


def _fts_phrase(token: str) -> str:
    return '"' + token.replace('"', '""') + '"'  # a quoted string is always a literal in FTS5


def _index_term(token: str) -> str:
    """The term unicode61 (remove_diacritics 2) stores for a token: Latin diacritics dropped."""
    if token.isascii():
        return token
    stripped = "".join(c for c in unicodedata.normalize("NFKD", token) if not unicodedata.combining(c))
    return stripped if all(ord(c) < 0x250 for c in stripped) else token


class LocalIndex:
    """A WikiBackend over an index file built by `build_index`. Safe to share across threads."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = self._open()
        self.meta = self._read_meta()
        self.page_count = int(self.meta["pages"])
        self.df_floor = int(self.meta["df_floor"])

    def _open(self) -> sqlite3.Connection:
        if self.path.is_dir():
            raise PipelineError(f"{self.path} is a folder, not a wiki index; give the index file (e.g. "
                                f"wiki.index={self.path / 'hotpotqa-local.sqlite'}), or build one with `{BUILD_HINT}`")
        if not self.path.is_file():
            raise PipelineError(f"{self.path}: wiki index not found; build it with `{BUILD_HINT}` "
                                f"(e.g. python -m pipeline wiki build --out {self.path})")
        uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
        db = sqlite3.connect(uri, uri=True, check_same_thread=False)
        db.execute("PRAGMA mmap_size=1073741824")
        return db

    def _broken(self, why: str) -> PipelineError:
        return PipelineError(f"{self.path}: not a usable wiki index ({why}); rebuild it with `{BUILD_HINT}`")

    def _read_meta(self) -> dict:
        try:
            rows = self._db.execute("SELECT key, value FROM meta").fetchall()
            meta = {key: json.loads(value) for key, value in rows}
        except (sqlite3.Error, json.JSONDecodeError) as exc:
            self._db.close()
            raise self._broken(str(exc)) from None
        if meta.get("format") != INDEX_FORMAT:
            self._db.close()
            raise self._broken(f"format {meta.get('format')}, this code reads format {INDEX_FORMAT}")
        if not meta.get("pages"):  # built from redirect sources alone, before the build refused that
            self._db.close()
            raise self._broken(f"it holds no pages, only {meta.get('redirects', 0)} redirects; build it "
                               f"from a source with page text: {PAGE_SOURCES_HELP}")
        return meta

    def _query(self, sql: str, params: tuple) -> list[tuple]:
        try:
            with self._lock:
                return self._db.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise self._broken(str(exc)) from None

    # -- WikiBackend

    def get_page(self, entity: str) -> Page | None:
        """The page `entity` names: exact key, redirect, near match (see the module docstring)."""
        key = title_key(entity)
        if not key:
            return None
        wanted = " ".join(entity.split())
        page = self._page_where("key", key, wanted)
        if page is None:
            page = self._redirected("key", key)
        if page is None:
            near = near_key(entity)
            page = self._page_where("near", near, wanted) or self._redirected("near", near)
        return page

    def _page_where(self, column: str, value: str, wanted: str) -> Page | None:
        rows = self._query(f"SELECT title, sentences, paragraphs FROM pages WHERE {column} = ? ORDER BY id", (value,))
        if not rows:
            return None
        capitalised = wanted[:1].upper() + wanted[1:]
        title, sentences, sizes = min(rows, key=lambda r: (r[0] != wanted, r[0] != capitalised))
        try:
            return Page(title, json.loads(sentences), tuple(json.loads(sizes)) if sizes else ())
        except json.JSONDecodeError as exc:
            raise self._broken(f"page {title!r}: {exc.msg}") from None

    def _redirected(self, column: str, value: str) -> Page | None:
        """One hop, as MediaWiki follows redirects: the target must be a page, not a redirect."""
        rows = self._query(f"SELECT target FROM redirects WHERE {column} = ? ORDER BY rowid LIMIT 1", (value,))
        if not rows:
            return None
        target = rows[0][0]
        return self._page_where("key", title_key(target), " ".join(target.split()))

    def similar_titles(self, entity: str, k: int = 5) -> list[str]:
        """Up to k titles ranked by BM25 over title (x10) and text, for the words of `entity`.

        Words in more than half of the pages have no BM25 weight and are dropped (if nothing
        else is left: none in a corpus larger than POSTINGS_BUDGET, where ranking them would
        score most pages for nothing; all words must match in a smaller one). Of the rest, the
        rarest are kept while the pages they match stay within POSTINGS_BUDGET, and any page
        holding one of them is ranked (OR). When even the rarest word is too common for that, all
        remaining words must match (AND), which stays fast; if no page has them all, the rarest
        word alone is used.
        """
        if k <= 0:
            return []
        tokens = query_tokens(entity)
        if not tokens:
            return []
        df = self._document_frequencies(tokens)  # None: in fewer than df_floor pages
        cost = {t: self.df_floor if df[t] is None else df[t] for t in tokens}
        informative = sorted((t for t in tokens if df[t] is None or df[t] * 2 <= self.page_count),
                             key=lambda t: cost[t])
        if not informative:
            if self.page_count > POSTINGS_BUDGET:
                return []
            return self._ranked(" AND ".join(map(_fts_phrase, tokens)), k)
        chosen, total = [], 0
        for token in informative:
            if total + cost[token] > POSTINGS_BUDGET:
                break
            chosen.append(token)
            total += cost[token]
        if chosen:
            return self._ranked(" OR ".join(map(_fts_phrase, chosen)), k)
        return self._ranked(" AND ".join(map(_fts_phrase, informative)), k) or self._ranked(
            _fts_phrase(informative[0]), k)

    def retrieve(self, query: str, k: int) -> list[Page]:
        """The retriever's answer to `query` (the `bm25` search mode, pipeline.wiki.env): the top
        k pages by BM25 over title (x TITLE_WEIGHT) and text, for the query's words OR'd, stop
        words left out. As in `similar_titles`, the rarest words are kept while the pages they
        match stay within POSTINGS_BUDGET (the rarest one always), so a question's common words
        ("film", "American") do not make every query score a large share of the corpus: on the
        500 offline-eval questions this keeps a gold page in the top 3 as often (93.6%) and both
        gold pages for 41.6% instead of 43.0%, in ~60% of the time (docs/environment.md)."""
        tokens = [t for t in query_tokens(query) if t not in STOP_WORDS]
        if k <= 0 or not tokens:
            return []
        df = self._document_frequencies(tokens)  # None: in fewer than df_floor pages
        cost = {t: self.df_floor if df[t] is None else df[t] for t in tokens}
        kept, total = [], 0
        for token in sorted(tokens, key=lambda t: cost[t]):
            if kept and total + cost[token] > POSTINGS_BUDGET:
                break
            kept.append(token)
            total += cost[token]
        rows = self._query(
            "SELECT p.title, p.sentences, p.paragraphs FROM (SELECT rowid, bm25(pages_fts, ?, ?) AS score "
            "FROM pages_fts WHERE pages_fts MATCH ? ORDER BY score LIMIT ?) AS hit "
            "JOIN pages p ON p.id = hit.rowid ORDER BY hit.score",
            (TITLE_WEIGHT, BODY_WEIGHT, " OR ".join(map(_fts_phrase, kept)), k),
        )
        try:
            return [Page(title, json.loads(sentences), tuple(json.loads(sizes)) if sizes else ())
                    for title, sentences, sizes in rows]
        except json.JSONDecodeError as exc:
            raise self._broken(f"a retrieved page: {exc.msg}") from None

    def _document_frequencies(self, tokens: list[str]) -> dict[str, int | None]:
        terms = {token: _index_term(token) for token in tokens}
        marks = ",".join("?" * len(terms))
        known = dict(self._query(f"SELECT term, df FROM term_df WHERE term IN ({marks})",
                                 tuple(set(terms.values()))))
        return {token: known.get(term) for token, term in terms.items()}

    def _ranked(self, match: str, k: int) -> list[str]:
        rows = self._query(
            "SELECT p.title FROM (SELECT rowid, bm25(pages_fts, ?, ?) AS score FROM pages_fts "
            "WHERE pages_fts MATCH ? ORDER BY score LIMIT ?) AS hit JOIN pages p ON p.id = hit.rowid "
            "ORDER BY hit.score",
            (TITLE_WEIGHT, BODY_WEIGHT, match, k),
        )
        return [title for (title,) in rows]

    # -- housekeeping

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> LocalIndex:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict:  # worker processes reopen the file instead of pickling it
        return {"path": self.path, **{k: getattr(self, k) for k in ENV_SETTINGS if hasattr(self, k)}}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])
        for key in ENV_SETTINGS:
            if state.get(key):
                setattr(self, key, state[key])

    def __repr__(self) -> str:
        return f"LocalIndex({str(self.path)!r}, pages={self.page_count})"
