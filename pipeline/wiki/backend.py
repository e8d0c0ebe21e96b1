"""What the environment needs from a source of Wikipedia pages.

Two backends implement it: `pipeline.wiki.index.LocalIndex` (a versioned SQLite FTS5 file, the
default: reproducible and fast) and `pipeline.wiki.live.LiveWikipedia` (the MediaWiki API,
cached on disk). The environment turns their pages into the paper's observation text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

DISAMBIGUATION_MARK = "may refer to:"


@dataclass(frozen=True)
class Page:
    title: str
    sentences: list[str]  # stripped sentences, in order (HotpotQA's own sentence split)
    # sentences per paragraph, in order; () = the whole page is one paragraph (an intro)
    paragraph_sizes: tuple[int, ...] = ()

    @property
    def is_disambiguation(self) -> bool:
        """The clean style's rule: the mark in the first sentences (a disambiguation page's lead)."""
        return any(DISAMBIGUATION_MARK in s for s in self.sentences[:3])

    def paragraphs(self) -> list[list[str]]:
        """The sentences grouped into paragraphs (one paragraph when no sizes are known)."""
        if not self.paragraph_sizes:
            return [list(self.sentences)] if self.sentences else []
        out, start = [], 0
        for size in self.paragraph_sizes:
            out.append(list(self.sentences[start:start + size]))
            start += size
        if start < len(self.sentences):  # sizes that undercount: the rest is one more paragraph
            out.append(list(self.sentences[start:]))
        return [p for p in out if p]


def paragraph_sizes(paragraphs: list[list[str]]) -> tuple[int, ...]:
    """The `Page.paragraph_sizes` of paragraphs; () for a single paragraph (the common case)."""
    sizes = tuple(len(p) for p in paragraphs if p)
    return sizes if len(sizes) > 1 else ()


class WikiBackend(Protocol):
    def get_page(self, entity: str) -> Page | None:
        """The page whose title matches `entity` after normalisation, or None."""

    def similar_titles(self, entity: str, k: int = 5) -> list[str]:
        """Up to k titles ranked by relevance to `entity` (for the 'Similar: [...]' of a miss)."""

    # A backend that can rank pages for a query (LocalIndex) also has
    # `retrieve(query, k) -> list[Page]`: the `bm25` search mode's top k pages.
