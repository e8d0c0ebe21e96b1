"""Where data comes from: an explicit path, the project's data/ cache, a local mirror, a download.

Resolution order for every input file (`resolve_source`):
  1. an explicit path the user gave (it must exist; no silent fallback),
  2. the project's cache, `data/<cache_relpath>` (`REACT_PIPELINE_DATA` moves it),
  3. a read-only local mirror, `<mirror>/<mirror_relpath>` (`REACT_PIPELINE_MIRROR`; by default
     ../shared/data beside the repository when that folder exists; "" or "none" turns it off),
  4. the official URL, downloaded into the data/ cache (`REACT_PIPELINE_OFFLINE=1` forbids it).
With none of these, a PipelineError says which file is needed, where to put it, and which
command downloads it.

    python -m pipeline data fetch prompts          # resolves (and downloads if needed) one source
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Source:
    """A known input file: where it lives in the cache and the mirror, and where it is published."""

    name: str
    cache_relpath: str
    mirror_relpath: str | None
    url: str | None
    fetch_command: str | None
    description: str


_HOTPOT = "http://curtis.ml.cmu.edu/datasets/hotpot"
_REACT = "https://raw.githubusercontent.com/ysymyth/ReAct/master"

SOURCES: dict[str, Source] = {s.name: s for s in [
    Source("hotpotqa-train", "hotpotqa/hotpot_train_v1.1.json", "hotpotqa/hotpot_train_v1.1.json",
           f"{_HOTPOT}/hotpot_train_v1.1.json", "python -m pipeline data fetch hotpotqa --split train",
           "HotpotQA train set, official JSON (540 MB)"),
    Source("hotpotqa-dev-distractor", "hotpotqa/hotpot_dev_distractor_v1.json",
           "hotpotqa/hotpot_dev_distractor_v1.json", f"{_HOTPOT}/hotpot_dev_distractor_v1.json",
           "python -m pipeline data fetch hotpotqa --split dev-distractor",
           "HotpotQA dev set, distractor setting, official JSON (46 MB)"),
    Source("hotpotqa-dev-fullwiki", "hotpotqa/hotpot_dev_fullwiki_v1.json",
           "hotpotqa/hotpot_dev_fullwiki_v1.json", f"{_HOTPOT}/hotpot_dev_fullwiki_v1.json",
           "python -m pipeline data fetch hotpotqa --split dev-fullwiki",
           "HotpotQA dev set, fullwiki setting, official JSON"),
    Source("hotpotqa-dev-simplified", "hotpotqa/dev_simplified.json", "hotpotqa/dev_simplified.json",
           f"{_REACT}/data/hotpot_dev_v1_simplified.json",
           "python -m pipeline data fetch hotpotqa --split dev-simplified",
           "HotpotQA dev as a {question, answer, type} list, official order (ReAct repo)"),
    Source("hotpotqa-with-context", "hotpotqa/with_context.jsonl", "hotpotqa/with_context.jsonl",
           None, None,
           "HotpotQA questions with their context paragraphs (the offline mirror's JSONL)"),
    Source("react-prompts", "react/prompts_naive.json", "react/prompts_naive.json",
           f"{_REACT}/prompts/prompts_naive.json", "python -m pipeline data fetch prompts",
           "the ReAct paper's HotpotQA few-shot exemplars"),
    Source("react-fever-prompts", "react/fever.json", "react/fever.json", f"{_REACT}/prompts/fever.json",
           "python -m pipeline data fetch fever-prompts", "the ReAct paper's FEVER few-shot exemplars (3 each)"),
    Source("fever-paper-dev", "fever/paper_dev.jsonl", "fever/paper_dev.jsonl", f"{_REACT}/data/paper_dev.jsonl",
           "python -m pipeline data fetch fever", "FEVER's paper dev claims, as the ReAct repo ships them (9,999)"),
    Source("react-fever-trajectories", "react/fever_react_davinci002_500_trajs.jsonl",
           "react/fever_react_davinci002_500_trajs.jsonl", None, None,
           "ReAct's 500 released text-davinci-002 FEVER trajectories (the offline mirror's)"),
    Source("wiki-abstracts", "wiki/enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2",
           "wiki/enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2",
           "https://nlp.stanford.edu/projects/hotpotqa/"
           "enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2",
           "python -m pipeline data fetch wiki-abstracts",
           "HotpotQA's enwiki-2017 intro-paragraph dump (tar.bz2)"),
    Source("wiki-processed", "wiki/enwiki-20171001-pages-meta-current-withlinks-processed.tar.bz2",
           "wiki/enwiki-20171001-pages-meta-current-withlinks-processed.tar.bz2",
           "https://nlp.stanford.edu/projects/hotpotqa/"
           "enwiki-20171001-pages-meta-current-withlinks-processed.tar.bz2",
           "python -m pipeline data fetch wiki-processed",
           "HotpotQA's enwiki-2017 full-article dump, every paragraph (tar.bz2)"),
    Source("wiki-corpus", "wiki/corpus.jsonl", "wiki/corpus.jsonl", None, None,
           "local Wikipedia pages {title, sentences} (the offline mirror's corpus)"),
]}


def cache_root() -> Path:
    """The user's cache of this project (converted models, running servers' records):
    `REACT_PIPELINE_CACHE`, else ~/.cache/react-pipeline."""
    root = os.environ.get("REACT_PIPELINE_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "react-pipeline"


def data_dir() -> Path:
    """The project's data cache (git-ignored): `REACT_PIPELINE_DATA`, else <repo>/data."""
    override = os.environ.get("REACT_PIPELINE_DATA")
    return Path(override).expanduser() if override else REPO_ROOT / "data"


def mirror_dir() -> Path | None:
    """A read-only local copy of the public data, or None when there is none."""
    override = os.environ.get("REACT_PIPELINE_MIRROR")
    if override is not None:
        if override.strip().lower() in ("", "none"):
            return None
        return Path(override).expanduser()
    default = REPO_ROOT.parent / "shared" / "data"
    return default if default.is_dir() else None


def downloads_allowed() -> bool:
    return os.environ.get("REACT_PIPELINE_OFFLINE", "").strip().lower() not in ("1", "true", "yes")


def resolve_source(
    name: str,
    explicit: str | os.PathLike | None = None,
    mirror_relpath: str | None = None,
    cache_relpath: str | None = None,
    url: str | None = None,
    *,
    fetch_command: str | None = None,
    download: bool = True,
    force_download: bool = False,
) -> Path:
    """Find the file called `name`: explicit > data/ cache > mirror > download into data/.

    For a name in SOURCES the locations default to that entry's; keyword arguments override it.
    `download=False` stops before the network; `force_download=True` skips the cache and mirror.
    """
    known = SOURCES.get(name)
    cache_relpath = cache_relpath or (known.cache_relpath if known else None)
    mirror_relpath = mirror_relpath or (known.mirror_relpath if known else None)
    url = url or (known.url if known else None)
    fetch_command = fetch_command or (known.fetch_command if known else None)
    if explicit is not None:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise PipelineError(f"{name}: {path} does not exist (or is not a file); check the path")
        return path
    if cache_relpath is None:
        raise PipelineError(f"unknown data source '{name}'; known: {', '.join(SOURCES)}")
    cached = data_dir() / cache_relpath
    mirror = mirror_dir()
    mirrored = mirror / mirror_relpath if mirror is not None and mirror_relpath else None
    if not force_download:
        if cached.is_file():
            return cached
        if mirrored is not None and mirrored.is_file():
            return mirrored
    failure = None
    if url and download and downloads_allowed():
        from pipeline.core.download import download as fetch

        try:
            return fetch(url, cached)
        except PipelineError as exc:
            failure = str(exc)
    raise PipelineError(_missing_message(name, cached, mirrored, mirror_relpath, url, fetch_command, failure))


def _missing_message(name: str, cached: Path, mirrored: Path | None, mirror_relpath: str | None,
                     url: str | None, fetch_command: str | None, failure: str | None) -> str:
    looked = f"looked in {cached}" + (f" and {mirrored}" if mirrored else " (no local mirror configured)")
    parts = [f"{name} not found: {looked}"]
    if failure:
        parts.append(failure)
    elif url and not downloads_allowed():
        parts.append("downloads are off (REACT_PIPELINE_OFFLINE)")
    how = f"put the file at {cached}"
    if not url:
        how += " (it has no official download: it comes with the offline data folder, ../shared/data)"
    else:
        how += f" (download it from {url}"
        how += f", or run `{fetch_command}` where the internet is reachable)" if fetch_command else ")"
    how += ", or pass its path explicitly"
    if mirror_relpath:
        how += f", or point REACT_PIPELINE_MIRROR at a folder holding it as {mirror_relpath}"
    parts.append(how)
    return "; ".join(parts)
