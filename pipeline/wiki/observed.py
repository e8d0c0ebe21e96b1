"""Pages rebuilt from the observations of released trajectories: a small local Wikipedia where no
dump is available offline (FEVER's: ReAct's 500 released FEVER trajectories saw live Wikipedia in
2022, and no copy of those pages ships with the data).

    python -m pipeline wiki build --corpus ../shared/data/react/fever_react_davinci002_500_trajs.jsonl \
        --out data/wiki/fever-observed.sqlite

A `.jsonl` corpus file whose records carry `traj` (ReAct's trajectory files) is read this way by
the index builder (pipeline.wiki.corpus.read_source). For every `Search[X]` that hit, page `X`
holds the observation's sentences (the scraping's "Pages for logged out editors learn more."
dropped; the text split as the original environment splits it, on '. '); every `Lookup` result
on that page adds its sentence after them. A title seen again (in the same or another
trajectory) adds only sentences it does not hold yet. Misses and disambiguation pages add
nothing, so a search that missed in 2022 misses here too, unless another trajectory found the
page. The pages hold only what the trajectories showed: the first five sentences and the ones
looked up.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.storage import utf8_lines
from pipeline.wiki.replay import SCRAPING_CHROME, parse_numbered

_SEARCH = re.compile(r"^\s*[Ss]earch\[(.+)\]\s*$")
_LOOKUP = re.compile(r"^\s*[Ll]ookup\[.*\]\s*$")
_RESULT = re.compile(r"^\(Result \d+ / \d+\) (.*)$")


def is_trajectory_file(path: Path) -> bool:
    """Whether a `.jsonl` file's first record is a released trajectory (has `traj`)."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.strip():
                try:
                    return isinstance(record := json.loads(line), dict) and "traj" in record
                except json.JSONDecodeError:
                    return False
    return False


def observation_sentences(observation: str) -> list[str]:
    """A Search observation's sentences: split on '. ' with the '.' put back, as wikienv.py cut them."""
    text = observation.strip().removeprefix(SCRAPING_CHROME).strip()
    pieces = [p.strip() for p in text.split(". ") if p.strip()]
    return [p + "." for p in pieces[:-1]] + pieces[-1:]


def observed_pages(path: str | Path, stats=None) -> Iterator[tuple[str, list[list[str]]]]:
    """(title, [sentences]) for every page the trajectories of `path` saw, in first-seen order."""
    pages: dict[str, list[str]] = {}
    records = 0
    for lineno, line in utf8_lines(path):
        if not line.strip():
            continue
        try:
            text = json.loads(line)["traj"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise PipelineError(f"{path}:{lineno}: not a released trajectory with 'traj' ({exc})") from None
        records += 1
        add_observed(pages, text)
    if stats is not None:
        stats.records, stats.pages = records, len(pages)
    for title, sentences in pages.items():
        yield title, [sentences]


def add_observed(pages: dict[str, list[str]], text: str) -> None:
    """Add one trajectory's hits and Lookup results to `pages`."""
    current = None
    for action, observation in parse_numbered(text):
        search, result = _SEARCH.match(action), _RESULT.match(observation.strip())
        if search:
            missed = observation.strip().startswith(("Could not find", "Invalid action"))
            current = None if missed else search.group(1).strip()
            if current:
                _extend(pages.setdefault(current, []), observation_sentences(observation))
        elif _LOOKUP.match(action) and result and current:
            _extend(pages[current], [result.group(1).strip()])


def _extend(sentences: list[str], new: list[str]) -> None:
    sentences += [s for s in new if s not in sentences]
