"""How a config names the Wikipedia an environment reads: a local index (default) or live."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from pipeline.core.config import at_least, checked, in_range
from pipeline.core.errors import PipelineError
from pipeline.wiki.backend import WikiBackend


@dataclass
class WikiConfig:
    # removed key -> why (pipeline.core.config): it was accepted and never read
    REMOVED_KEYS: ClassVar[dict[str, str]] = {"max_steps": "never read; the step limit is prompting.max_steps"}

    backend: str = "local"  # local | live
    # local: a SQLite index built by `python -m pipeline wiki build`; built on first use from
    # `corpus` when missing (the default corpus is the offline 2017 HotpotQA paragraphs).
    index: Path = Path("data/wiki/hotpotqa-local.sqlite")
    corpus: list[str] = field(default_factory=lambda: ["mirror:wiki/corpus.jsonl"])
    # live: the MediaWiki API, every answer cached on disk so a re-run sends no request
    api_url: str = "https://en.wikipedia.org/w/api.php"
    cache: Path = Path("data/wiki/live-cache.sqlite")
    timeout_s: float = checked(in_range(0, above=True), default=20.0)
    max_retries: int = at_least(0, default=5)
    # clean | original: the text and rules of the environment's observations (pipeline/wiki/env.py;
    # "original" is wikienv.py's own, `..` and all; docs/environment.md compares them side by side)
    observation_style: str = "clean"
    # title | bm25: what Search[...] does (pipeline/wiki/env.py; docs/environment.md shows both).
    # title, the paper's: one page by its exact title, "Could not find X. Similar: [...]" on a miss.
    # bm25, a retriever: the top `search_k` pages of the local index by BM25 for the query, each
    # with its title, as one observation; Lookup walks the retrieved pages' sentences
    search: str = checked(lambda v: search_mode_error(v), default="title")
    search_k: int = at_least(1, "pages a bm25 Search shows", default=3)


def search_mode_error(mode: object) -> str | None:
    """Why `mode` is not a wiki.search value (said after the key's name), or None."""
    from pipeline.wiki.env import SEARCH_MODES

    if mode in SEARCH_MODES:
        return None
    return (f"must be {' or '.join(SEARCH_MODES)}, got '{mode}' (title: the paper's exact-title search; "
            "bm25: a retriever over the local index)")


def check_search(cfg: WikiConfig) -> None:
    """Refuse a search mode this page source cannot serve, reading nothing (plan time too)."""
    error = search_mode_error(cfg.search)
    if error:
        raise PipelineError(f"wiki.search {error}")
    if cfg.search_k < 1:
        raise PipelineError(f"wiki.search_k must be >= 1 (pages a bm25 Search shows), got {cfg.search_k}")
    if cfg.search == "bm25" and cfg.backend != "local":
        raise PipelineError(f"wiki.search=bm25 ranks the pages of a local index; wiki.backend={cfg.backend} has "
                            "none: use wiki.backend=local (or wiki.search=title)")


def search_of(manifest: dict | None) -> str:
    """The search mode a run's manifest says its episodes used: its `search`, else its config's
    `wiki.search`, else "title" (every run written before the key searched by exact title)."""
    manifest = manifest or {}
    wiki = (manifest.get("config") or {}).get("wiki") or {}
    return str(manifest.get("search") or wiki.get("search") or "title")


def resolve_corpus(spec: str) -> Path:
    """`mirror:<relpath>` names a file of the local data mirror (../shared/data by default)."""
    if not spec.startswith("mirror:"):
        return Path(spec)
    from pipeline.core.paths import mirror_dir

    mirror = mirror_dir()
    relpath = spec[len("mirror:"):]
    if mirror is None or not (mirror / relpath).exists():
        raise PipelineError(
            f"corpus '{spec}' not found: no local data mirror has {relpath}; set "
            "REACT_PIPELINE_MIRROR to a folder that has it, or give wiki.corpus=PATH "
            "(a corpus JSONL, HotpotQA file or the enwiki-2017 abstracts dump)"
        )
    return mirror / relpath


def open_backend(cfg: WikiConfig) -> WikiBackend:
    """The page source `cfg` names, carrying `cfg.observation_style` and the search mode
    (`search_mode`, `search_k`) for every WikiEnv over it: the one place a stage's wiki settings
    are resolved (pipeline.wiki.index.ENV_SETTINGS keeps them across processes)."""
    from pipeline.wiki.env import OBSERVATION_STYLES

    if cfg.observation_style not in OBSERVATION_STYLES:
        raise PipelineError(f"wiki.observation_style '{cfg.observation_style}' is unknown; use "
                            f"{' or '.join(OBSERVATION_STYLES)}")
    check_search(cfg)
    backend = _open(cfg)
    backend.observation_style = cfg.observation_style
    backend.search_mode, backend.search_k = cfg.search, cfg.search_k
    return backend


def _open(cfg: WikiConfig) -> WikiBackend:
    if cfg.backend == "local":
        from pipeline.wiki.index import INDEX_FORMAT, LocalIndex, build_index, index_format

        corpus = [resolve_corpus(c) for c in cfg.corpus]
        if Path(cfg.index).is_file() and corpus and (index_format(cfg.index) or INDEX_FORMAT) < INDEX_FORMAT:
            # an index this code's older self built: derived data, so rebuild it from the same corpus
            print(f"{cfg.index} has an older index format; rebuilding it from {[str(c) for c in corpus]}")
            build_index(corpus, Path(cfg.index))
        if not Path(cfg.index).exists():
            build_index(corpus, Path(cfg.index))
        index = LocalIndex(Path(cfg.index))
        check_index_matches(index, corpus)
        return index
    if cfg.backend == "live":
        from pipeline.wiki.live import LiveWikipedia

        return LiveWikipedia(api_url=cfg.api_url, cache_path=Path(cfg.cache),
                             timeout_s=cfg.timeout_s, max_retries=cfg.max_retries)
    raise PipelineError(f"wiki.backend '{cfg.backend}' is unknown; use 'local' or 'live'")


def check_index_matches(index, corpus: list[Path]) -> None:
    """Refuse an index built from other corpus files (compared by name and size, not path, so
    a clone in another folder still matches)."""
    built = sorted((Path(s["path"]).name, s.get("size")) for s in index.meta.get("sources", []))
    wanted = sorted((p.name, p.stat().st_size) for p in corpus if p.is_file())
    if wanted and built != wanted:
        raise PipelineError(
            f"{index.path} was built from {[b[0] for b in built]}, not from wiki.corpus "
            f"{[str(p) for p in corpus]}; delete it (it is rebuilt on first use) or set wiki.index to another file"
        )
