"""Stream Wikipedia pages out of the corpus formats the index accepts, never loading a file whole.

    for page in iter_pages("../shared/data/wiki/corpus.jsonl"): print(page.title)

Containers (chosen by the path) and records (recognised by their keys):
- `.jsonl`: one record per line, either a page `{"title", "sentences": [...]}` / `{"title",
  "text": ...}`, or a HotpotQA question record with `context` (our `with_context.jsonl`); or
  released ReAct trajectories (`traj` per record): pages rebuilt from their observations
  (pipeline.wiki.observed; FEVER's offline corpus);
- `.json`: a JSON list of such records, parsed incrementally (the official HotpotQA files,
  `hotpot_train_v1.1.json` is 540 MB);
- the HotpotQA enwiki-2017 dump, `enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2`:
  a tar.bz2 whose members are bz2-compressed JSON-lines files, one page per line (`id`, `url`,
  `title`, `text` = the intro paragraph as a list of sentences, `text_with_links`, offsets).
  Also read: the unpacked folder of shards, or one `.bz2` shard. HotpotQA's full-article
  "processed" dump (`enwiki-20171001-pages-meta-current-withlinks-processed.tar.bz2`) has the
  same layout with `text` = every paragraph of the page (lists of sentences): the fullest 2017
  source, so Lookup sees whole pages.
- `.parquet` / `.arrow`: a local copy of the `wikimedia/wikipedia` dataset (`{id, url, title,
  text}`, paragraphs separated by blank lines), streamed through `datasets` (`streaming=True`).
- Redirects, not pages: a pages-articles XML dump (`.xml` / `.xml.bz2`: the `<redirect title=...>`
  element of each main-namespace `<page>`; article wikitext is not read) or a redirect table
  (`.tsv` / `.tsv.bz2` / `.tsv.gz`: `from<TAB>to` title per line, e.g. exported from the
  `redirect` and `page` SQL tables). `read_redirects` streams them; the index stores them.

Pages from records:
- `sentences` / `text` as a list of sentences is used as is; as a list of paragraphs (lists of
  sentences, the full "processed" dump) it is flattened, dropping a first paragraph that only
  repeats the title; as one string (`wikimedia/wikipedia`) its section headings are dropped
  (`text_lines`: a line of its own between blank lines that ends no sentence) and each line is
  a paragraph cut by `split_sentences`.
- HotpotQA `context` pairs `[title, sentences]` (or the Hugging Face layout `{"title": [...],
  "sentences": [...]}`) are pages; a title already seen in the same file is skipped, since the
  same paragraph recurs across questions.
- `<a href="...">...</a>` link markup is removed; sentences are stripped (HotpotQA keeps the
  space between sentences at the start of each one) and empty ones dropped; a page with no
  sentence left is skipped and counted.
Anything unreadable raises PipelineError naming the file (and archive member) and the line.
"""

from __future__ import annotations

import bz2
import json
import re
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from pipeline.core.errors import PipelineError
from pipeline.wiki.backend import Page, paragraph_sizes
from pipeline.wiki.observed import is_trajectory_file, observed_pages

FORMATS_HELP = (
    "corpus JSONL ({title, sentences} or {title, text} per line), HotpotQA JSON/JSONL with "
    "context paragraphs, released ReAct trajectories (.jsonl with traj), or the HotpotQA enwiki dump (.tar.bz2 of .bz2 JSON-lines shards, its "
    "unpacked folder, or one .bz2 shard; the processed full-article dump alike), a local "
    "wikimedia/wikipedia .parquet/.arrow file, or redirects (.xml[.bz2] pages-articles dump, "
    "from<TAB>to .tsv)"
)
# The sources that give page text (the index needs at least one) and those that only add redirects.
PAGE_SOURCES_HELP = (
    "a corpus JSONL, a HotpotQA JSON/JSONL with context paragraphs, the HotpotQA enwiki-2017 dump "
    "(abstracts or the full-article processed one: `python -m pipeline data fetch wiki-processed`) "
    "or a local wikimedia/wikipedia .parquet/.arrow file"
)
_TAR_SUFFIXES = (".tar.bz2", ".tbz2", ".tbz", ".tar", ".tar.gz", ".tgz")
REDIRECT_CONTAINERS = ("xml-dump", "redirect-table")
_MAX_JSON_ELEMENT = 64 * 1024 * 1024  # one record of a JSON list; larger means the file is broken


@dataclass
class SourceStats:
    """What one corpus source contributed (goes into the index's meta table)."""

    path: str
    container: str
    records: int = 0  # lines / list elements read
    pages: int = 0  # pages handed to the index
    empty_pages: int = 0  # skipped: no sentence
    repeated_titles: int = 0  # skipped: a context title already seen in this file
    redirects: int = 0  # redirect sources: (from, to) pairs read

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- text clean-up


_LINK_TAG = re.compile(r"</?a\b[^>]*>", re.IGNORECASE)


def strip_links(text: str) -> str:
    """Remove `<a href="...">` / `</a>` tags, keeping the anchor text."""
    return _LINK_TAG.sub("", text)


# Words that end in a period without ending a sentence (lower-case, without the final period).
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr vs etc inc ltd co corp no nos mt ft gen col lt sgt capt cmdr "
    "rev hon fig vol pp ed eds ca approx dept est univ jan feb mar apr jun jul aug sep sept "
    "oct nov dec e.g i.e u.s u.k a.m p.m".split()
)
_CANDIDATE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s)")
_OPENERS = "\"'“‘(["


def split_sentences(text: str) -> list[str]:
    """Cut plain text into sentences with a simple, predictable rule.

    A line break always ends a sentence. Otherwise a sentence ends at `.`, `!` or `?` (with any
    closing quotes or brackets after it) when whitespace follows and the next word starts with
    an upper-case letter, a digit or an opening quote/bracket, unless the word before a `.` is a
    single letter (an initial: "J. R. R. Tolkien") or a known abbreviation ("Mr.", "St.",
    "U.S.", "e.g.", months). Sentences come back stripped, empty ones dropped.
    """
    sentences: list[str] = []
    for paragraph in text.splitlines():
        start = 0
        for match in _CANDIDATE_END.finditer(paragraph):
            rest = paragraph[match.end():].lstrip()
            if not rest or not (rest[0].isupper() or rest[0].isdigit() or rest[0] in _OPENERS):
                continue
            if match.group().startswith(".") and _is_abbreviation(paragraph[start:match.start()]):
                continue
            sentences.append(paragraph[start:match.end()])
            start = match.end()
        sentences.append(paragraph[start:])
    return [s.strip() for s in sentences if s.strip()]


def _is_abbreviation(before_period: str) -> bool:
    words = before_period.split()
    if not words:
        return False
    word = words[-1].lstrip(_OPENERS).lower()
    return (len(word) == 1 and word.isalpha()) or word in _ABBREVIATIONS


# A line that ends a sentence: . ! ? : ; or an ellipsis, then any closing quotes or brackets.
_SENTENCE_END = re.compile(r"[.!?:;…][\"'”’)\]]*$")


def text_lines(text: str) -> list[str]:
    """The lines of a page's plain text without its section headings. A heading (in the
    `wikimedia/wikipedia` text: "Role in The Simpsons") is a line of its own between blank lines
    (or the text's start or end) that ends no sentence; the original environment read `<p>` text
    only, so headings were never sentences, and kept they would be glued to the next one."""
    lines = text.splitlines()

    def blank(i: int) -> bool:
        return not 0 <= i < len(lines) or not lines[i].strip()

    return [line for i, line in enumerate(lines) if line.strip()
            and not (blank(i - 1) and blank(i + 1) and not _SENTENCE_END.search(line.rstrip()))]


def page_sentences(title: str, body: Any) -> list[str]:
    """The stripped, non-empty sentences of a page body (see the module docstring for shapes)."""
    return [s for paragraph in page_paragraphs(title, body) for s in paragraph]


def page_paragraphs(title: str, body: Any) -> list[list[str]]:
    """The page body's sentences grouped by paragraph: a list of sentences is one paragraph, a
    list of lists is one paragraph per list, a string one paragraph per non-empty line."""
    if isinstance(body, str):
        text = strip_links(body) if "<" in body else body
        return [p for p in (split_sentences(line) for line in text_lines(text)) if p]
    if not isinstance(body, list):
        raise ValueError(f"sentences/text must be a string or a list, not {type(body).__name__}")
    if body and isinstance(body[0], list):
        if not all(isinstance(p, list) for p in body):
            raise ValueError("text mixes paragraphs (lists) and sentences (strings)")
        if len(body[0]) == 1 and isinstance(body[0][0], str) and body[0][0].strip() == title:
            body = body[1:]  # the full dump's first "paragraph" is the title itself
        return [p for p in (_clean_sentences(paragraph) for paragraph in body) if p]
    sentences = _clean_sentences(body)
    return [sentences] if sentences else []


def _clean_sentences(body: list) -> list[str]:
    sentences = []
    for s in body:
        if not isinstance(s, str):
            raise ValueError(f"a sentence must be a string, not {type(s).__name__}")
        if "<" in s:
            s = strip_links(s)
        s = s.strip()
        if s:
            sentences.append(s)
    return sentences


# ---------------------------------------------------------------- records -> pages


class _Reader:
    """Turns the records of one source into (title, paragraphs) pairs, counting what it skips."""

    def __init__(self, stats: SourceStats):
        self.stats = stats
        self.context_titles: set[str] = set()

    def pages(self, record: Any, where: str) -> Iterator[tuple[str, list[list[str]]]]:
        self.stats.records += 1
        if not isinstance(record, dict):
            raise PipelineError(f"{where}: expected a JSON object, found {type(record).__name__}")
        if "context" in record:
            yield from self._context_pages(record["context"], where)
        elif "title" in record and ("sentences" in record or "text" in record):
            body = record["sentences"] if "sentences" in record else record["text"]
            page = self._page(record["title"], body, where)
            if page is not None:
                yield page
        else:
            keys = ", ".join(sorted(map(str, record))[:8])
            raise PipelineError(
                f"{where}: not a page ({{title, sentences}} or {{title, text}}) nor a HotpotQA "
                f"record with context (keys: {keys}); expected {FORMATS_HELP}"
            )

    def _context_pages(self, context: Any, where: str) -> Iterator[tuple[str, list[list[str]]]]:
        if isinstance(context, dict):  # Hugging Face layout: parallel title / sentences lists
            titles, bodies = context.get("title", []), context.get("sentences", [])
            if not isinstance(titles, list) or not isinstance(bodies, list) or len(titles) != len(bodies):
                raise PipelineError(f"{where}: context title and sentences lists differ in length")
            context = list(zip(titles, bodies, strict=True))
        if not isinstance(context, list):
            raise PipelineError(f"{where}: context must be a list of [title, sentences] pairs")
        for pair in context:
            if not (isinstance(pair, list | tuple) and len(pair) == 2):
                raise PipelineError(f"{where}: a context entry must be [title, sentences], found {str(pair)[:80]!r}")
            title, body = pair
            if title in self.context_titles:
                self.stats.repeated_titles += 1
                continue
            if isinstance(title, str):
                self.context_titles.add(title)
            page = self._page(title, body, where)
            if page is not None:
                yield page

    def _page(self, title: Any, body: Any, where: str) -> tuple[str, list[list[str]]] | None:
        if not isinstance(title, str) or not title.strip():
            raise PipelineError(f"{where}: a page needs a non-empty string title, found {title!r:.80}")
        title = title.strip()
        try:
            paragraphs = page_paragraphs(title, body)
        except ValueError as exc:
            raise PipelineError(f"{where}: page {title!r:.80}: {exc}") from None
        if not paragraphs:
            self.stats.empty_pages += 1
            return None
        self.stats.pages += 1
        return title, paragraphs


# ---------------------------------------------------------------- containers


def container_of(path: Path) -> str:
    """Which reader a path needs: jsonl | json | dump-tar | dump-folder | dump-shard | parquet |
    arrow (pages) or xml-dump | redirect-table (redirects)."""
    if path.is_dir():
        return "dump-folder"
    name = path.name.lower()
    if name.endswith((".xml", ".xml.bz2")):
        return "xml-dump"
    if name.endswith((".tsv", ".tsv.bz2", ".tsv.gz")):
        return "redirect-table"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".arrow"):
        return "arrow"
    if name.endswith(_TAR_SUFFIXES):
        return "dump-tar"
    if name.endswith(".bz2"):
        return "dump-shard"
    if name.endswith(".jsonl"):
        return "jsonl"
    if name.endswith(".json"):
        return "json"
    raise PipelineError(f"{path}: unknown corpus format (by its name); expected {FORMATS_HELP}")


def read_source(path: str | Path, stats: SourceStats | None = None) -> Iterator[tuple[str, list[list[str]]]]:
    """Yield (title, paragraphs: lists of sentences) for every page of one source, streaming.
    Fills `stats`."""
    path = Path(path)
    if not path.exists():
        raise PipelineError(f"{path}: corpus file not found; check the path (expected {FORMATS_HELP})")
    container = container_of(path)
    stats = stats if stats is not None else SourceStats(str(path), container)
    reader = _Reader(stats)
    if container in REDIRECT_CONTAINERS:
        raise PipelineError(f"{path}: a redirect source, not pages; read it with read_redirects")
    if container == "jsonl" and is_trajectory_file(path):  # released trajectories: pages from observations
        yield from observed_pages(path, stats)
        return
    if container in ("parquet", "arrow"):
        for where, record in _dataset_records(path, container):
            yield from reader.pages(record, where)
        return
    if container == "json":
        with open(path, encoding="utf-8") as fh:
            for where, record in _json_list(fh, str(path)):
                yield from reader.pages(record, where)
        return
    for where, lines in _line_streams(path, container):
        for lineno, line in _numbered(lines, where):
            if not line.strip():
                continue
            try:
                record = _decode_json(line.decode("utf-8"))  # per line, so errors name the line
            except json.JSONDecodeError as exc:
                raise PipelineError(f"{where}:{lineno}: not valid JSON ({exc.msg}); fix or remove that line") from None
            except UnicodeDecodeError as exc:
                raise PipelineError(f"{where}:{lineno}: not UTF-8 text ({exc.reason})") from None
            yield from reader.pages(record, f"{where}:{lineno}")


def iter_pages(path: str | Path) -> Iterator[Page]:
    """The pages of one corpus source as `Page` objects (convenience over `read_source`)."""
    for title, paragraphs in read_source(path):
        yield Page(title, [s for p in paragraphs for s in p], paragraph_sizes(paragraphs))


def _dataset_records(path: Path, container: str) -> Iterator[tuple[str, dict]]:
    """Rows of a local parquet / arrow file through `datasets`, streamed (never loaded whole)."""
    import datasets

    try:
        rows = datasets.load_dataset(container, data_files=str(path), split="train", streaming=True)
        for i, row in enumerate(rows, 1):
            yield f"{path}:row {i}", row
    except (OSError, ValueError, datasets.exceptions.DatasetGenerationError) as exc:
        raise PipelineError(f"{path}: not a readable {container} file ({str(exc).splitlines()[0]})") from None


def read_redirects(path: str | Path, stats: SourceStats | None = None) -> Iterator[tuple[str, str]]:
    """Yield (from title, to title) for every redirect of a redirect source, streaming."""
    path = Path(path)
    container = container_of(path)
    stats = stats if stats is not None else SourceStats(str(path), container)
    if container == "xml-dump":
        yield from _xml_redirects(path, stats)
    elif container == "redirect-table":
        yield from _tsv_redirects(path, stats)
    else:
        raise PipelineError(f"{path}: not a redirect source (an .xml[.bz2] dump or a .tsv table)")


def _open_text(path: Path) -> IO:
    import gzip

    name = path.name.lower()
    opener = bz2.open if name.endswith(".bz2") else gzip.open if name.endswith(".gz") else open
    return opener(path, "rb")


def _tsv_redirects(path: Path, stats: SourceStats) -> Iterator[tuple[str, str]]:
    with _open_text(path) as fh:
        for lineno, raw in _numbered(fh, str(path)):
            line = raw.decode("utf-8", errors="strict").rstrip("\r\n") if raw.strip() else ""
            if not line:
                continue
            stats.records += 1
            parts = line.split("\t")
            if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
                raise PipelineError(f"{path}:{lineno}: expected 'from<TAB>to' (two titles), found {line[:80]!r}")
            stats.redirects += 1
            yield parts[0].strip(), parts[1].strip()


def _xml_redirects(path: Path, stats: SourceStats) -> Iterator[tuple[str, str]]:
    """`<page><title>A</title><ns>0</ns><redirect title="B"/>...` of a MediaWiki XML dump."""
    import xml.etree.ElementTree as ET

    with _open_text(path) as fh:
        try:
            for _, elem in ET.iterparse(fh, events=("end",)):
                if elem.tag.rsplit("}", 1)[-1] != "page":
                    continue
                stats.records += 1
                fields = {child.tag.rsplit("}", 1)[-1]: child for child in elem}
                redirect, title, ns = fields.get("redirect"), fields.get("title"), fields.get("ns")
                if redirect is not None and title is not None and (ns is None or ns.text == "0"):
                    target = redirect.get("title", "").strip()
                    if title.text and target:
                        stats.redirects += 1
                        yield title.text.strip(), target
                elem.clear()  # keep memory flat over a multi-GB dump
        except (ET.ParseError, OSError, EOFError) as exc:
            raise PipelineError(f"{path}: not a readable MediaWiki XML dump ({exc})") from None


_decode_json = json.JSONDecoder().decode  # json.loads(bytes) would sniff the encoding per line


def _numbered(lines: Iterable[bytes], where: str) -> Iterator[tuple[int, bytes]]:
    """enumerate(lines, 1), turning decompression failures into PipelineError."""
    lineno = 0
    iterator = iter(lines)
    while True:
        try:
            line = next(iterator)
        except StopIteration:
            return
        except (OSError, EOFError, tarfile.TarError) as exc:
            raise PipelineError(f"{where}: unreadable or truncated compressed data near line {lineno + 1} ({exc})") from None
        lineno += 1
        yield lineno, line


def _line_streams(path: Path, container: str) -> Iterator[tuple[str, Iterable[bytes]]]:
    """(where, byte lines) for each JSON-lines stream inside the source."""
    if container == "jsonl":
        with open(path, "rb") as fh:
            yield str(path), fh
    elif container == "dump-shard":
        with bz2.open(path, "rb") as fh:
            yield str(path), fh
    elif container == "dump-folder":
        shards = sorted(p for p in path.rglob("*") if p.is_file() and _is_shard(p.name))
        for shard in shards:
            with (bz2.open if shard.name.endswith(".bz2") else open)(shard, "rb") as fh:
                yield str(shard), fh
    else:
        yield from _tar_streams(path)


def _is_shard(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base.endswith((".bz2", ".jsonl")) or base.startswith("wiki_")


def _tar_streams(path: Path) -> Iterator[tuple[str, Iterable[bytes]]]:
    """Members of a (compressed) tar, read front to back without unpacking it to disk."""
    try:
        tar = tarfile.open(path, mode="r|*")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise PipelineError(f"{path}: not a readable tar archive ({exc}); expected {FORMATS_HELP}") from None
    with tar:
        while True:
            try:
                member = tar.next()
            except (tarfile.TarError, OSError, EOFError) as exc:
                raise PipelineError(f"{path}: truncated or corrupt archive ({exc})") from None
            if member is None:
                return
            if not member.isfile() or not _is_shard(member.name):
                continue
            raw = tar.extractfile(member)
            stream = bz2.BZ2File(raw) if member.name.endswith(".bz2") else raw
            yield f"{path}:{member.name}", stream


def _json_list(fh: IO[str], where: str, chunk_chars: int = 1 << 20) -> Iterator[tuple[str, Any]]:
    """Yield (where:line, element) from a top-level JSON list, decoding it chunk by chunk."""
    decoder = json.JSONDecoder()
    buffer, pos, line, eof = "", 0, 1, False
    started = False

    def refill() -> bool:
        nonlocal buffer, pos
        try:
            chunk = fh.read(chunk_chars)
        except UnicodeDecodeError as exc:
            raise PipelineError(f"{where}:{line}: not UTF-8 text ({exc.reason})") from None
        buffer, pos = buffer[pos:] + chunk, 0
        return bool(chunk)

    while True:
        while pos < len(buffer) and (buffer[pos].isspace() or (started and buffer[pos] == ",")):
            line += buffer[pos] == "\n"
            pos += 1
        if pos >= len(buffer):
            if eof or not refill():
                raise PipelineError(f"{where}:{line}: the JSON list ends early (missing ']'); the file is truncated")
            continue
        if not started:
            if buffer[pos] != "[":
                raise PipelineError(f"{where}:{line}: expected a JSON list of records; expected {FORMATS_HELP}")
            started, pos = True, pos + 1
            continue
        if buffer[pos] == "]":
            return
        try:
            element, end = decoder.raw_decode(buffer, pos)
        except json.JSONDecodeError as exc:
            if not eof and len(buffer) - pos < _MAX_JSON_ELEMENT:
                eof = not refill()
                continue
            bad_line = line + buffer.count("\n", pos, exc.pos)
            raise PipelineError(f"{where}:{bad_line}: not valid JSON ({exc.msg})") from None
        yield f"{where}:{line}", element
        line += buffer.count("\n", pos, end)
        pos = end
