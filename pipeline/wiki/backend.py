"""What the environment needs from a source of Wikipedia pages.

Two backends implement it: `pipeline.wiki.index.LocalIndex` (a versioned SQLite FTS5 file, the
default: reproducible and fast) and `pipeline.wiki.live.LiveWikipedia` (the MediaWiki API,
cached on disk). The environment turns their pages into the paper's observation text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Page:
    title: str
    sentences: list[str]  # stripped sentences, in order (HotpotQA's own sentence split)

    @property
    def is_disambiguation(self) -> bool:
        return any("may refer to:" in s for s in self.sentences[:3])


class WikiBackend(Protocol):
    def get_page(self, entity: str) -> Page | None:
        """The page whose title matches `entity` after normalisation, or None."""

    def similar_titles(self, entity: str, k: int = 5) -> list[str]:
        """Up to k titles ranked by relevance to `entity` (for the 'Similar: [...]' of a miss)."""
