"""A deterministic synthetic Wikipedia: realistic-looking titles and intro sentences.

Used by bench/bench_wiki.py to measure the index at 1,000,000 pages, which no offline corpus here
reaches. Names are pseudo-words built from syllables (so the vocabulary is large and Zipf-like,
as in real titles); sentences follow the shapes of Wikipedia intros (`X is a ... in Y.`, dates,
numbers, other titles mentioned), and about 1% are disambiguation pages.

    python bench/synthetic_wiki.py 1000 /tmp/synthetic.jsonl     # write 1,000 pages
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path

SYLLABLES = (
    "ka ren dor li mar ta vel son bri an tho mas el ri co ve na ber gan lo sa mi tor ra den fi "
    "ol ham ston wick ford ley ton burg ia en us ar is ma do re kel vin har lan ge mo"
).split()
NOUNS = (
    "album film novel song band river village town county company school university church "
    "railway station bridge castle album series party football club team league festival "
    "magazine newspaper species genus mountain lake island airport museum hospital district "
    "award battle treaty dynasty opera ballet painting sculpture journal novelist actor"
).split()
ADJECTIVES = (
    "American British Canadian Australian German French Italian Irish Scottish independent "
    "historic public private national regional former professional rural coastal northern "
    "southern eastern western modern classical experimental annual"
).split()
VERBS = (
    "founded established released published recorded directed written produced designed "
    "built opened named acquired formed"
).split()
KINDS = ("film", "album", "novel", "song", "band", "TV series", "play", "video game")
EVENTS = ("Open", "Championship", "election", "Festival", "Cup", "Grand Prix", "Olympiad")
INSTITUTIONS = ("University", "College", "Railway", "Football Club", "Museum", "Airport", "Records")


class SyntheticWiki:
    """Pools of names drawn once from a seeded generator; `pages(n)` yields {title, sentences}."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        self.given = self._names(2500, 2, 3)
        self.surnames = self._names(9000, 2, 4)
        self.places = self._names(5000, 2, 4)
        self.regions = self._names(300, 3, 4)

    def _names(self, count: int, low: int, high: int) -> list[str]:
        names: set[str] = set()
        while len(names) < count:
            parts = self.rng.randint(low, high)
            names.add("".join(self.rng.choice(SYLLABLES) for _ in range(parts)).capitalize())
        return sorted(names)

    def title(self) -> tuple[str, str]:
        r, pick = self.rng, self.rng.choice
        roll = r.random()
        if roll < 0.40:
            return "person", f"{pick(self.given)} {pick(self.surnames)}"
        if roll < 0.55:
            place = pick(self.places)
            return "place", place if r.random() < 0.5 else f"{place}, {pick(self.regions)}"
        if roll < 0.75:
            work = f"{pick(ADJECTIVES)} {pick(self.surnames)}".replace("  ", " ")
            if r.random() < 0.3:
                work = f"The {work}"
            if r.random() < 0.5:
                work += f" ({r.randint(1900, 2017)} {pick(KINDS)})" if r.random() < 0.5 else f" ({pick(KINDS)})"
            return "work", work
        if roll < 0.85:
            return "organisation", f"{pick(self.places)} {pick(INSTITUTIONS)}"
        if roll < 0.90:
            return "list", f"List of {pick(NOUNS)}s in {pick(self.places)}"
        return "event", f"{r.randint(1950, 2017)} {pick(self.places)} {pick(EVENTS)}"

    def sentence(self, subject: str) -> str:
        r, pick = self.rng, self.rng.choice
        year = r.randint(1800, 2017)
        shapes = (
            f"{subject} was {pick(VERBS)} in {year} by {pick(self.given)} {pick(self.surnames)} in {pick(self.places)}.",
            f"It is located in the {pick(ADJECTIVES).lower()} part of {pick(self.places)}, about {r.randint(2, 90)} km from {pick(self.places)}.",
            f"The {pick(NOUNS)} has a population of {r.randint(100, 900000):,} as of the {year} census.",
            f"In {year}, it was {pick(VERBS)} as part of the {pick(self.surnames)} {pick(NOUNS)} of {pick(self.places)}.",
            f"{pick(self.given)} {pick(self.surnames)} ({year}–{year + r.randint(20, 90)}) was a {pick(ADJECTIVES)} {pick(NOUNS)} and {pick(NOUNS)}.",
            f"It won the {pick(self.surnames)} {pick(EVENTS)} in {year} and again in {year + r.randint(1, 12)}.",
        )
        return pick(shapes)

    def intro(self, kind: str, title: str) -> list[str]:
        r, pick = self.rng, self.rng.choice
        if kind == "person":
            first = (f"{title} (born {r.randint(1900, 2000)}) is a {pick(ADJECTIVES)} {pick(NOUNS)} "
                     f"and {pick(NOUNS)} from {pick(self.places)}.")
        else:
            first = f"{title} is a {pick(ADJECTIVES).lower()} {pick(NOUNS)} in {pick(self.places)}, {pick(self.regions)}."
        return [first] + [self.sentence(pick(("It", "The " + pick(NOUNS), title))) for _ in range(r.randint(2, 5))]

    def pages(self, count: int) -> Iterator[dict]:
        seen: set[str] = set()
        while len(seen) < count:
            kind, title = self.title()
            if title in seen:
                continue
            seen.add(title)
            if self.rng.random() < 0.01:  # a disambiguation page, as HotpotQA's dump has
                sentences = [f"{title} may refer to:"] + [f"{title} ({k})" for k in self.rng.sample(KINDS, 3)]
            else:
                sentences = self.intro(kind, title)
            yield {"title": title, "sentences": sentences}


def write_corpus(count: int, path: Path, seed: int = 0) -> Path:
    """Write `count` synthetic pages as corpus JSONL ({title, sentences} per line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for page in SyntheticWiki(seed).pages(count):
            out.write(json.dumps(page, ensure_ascii=False) + "\n")
    return path


if __name__ == "__main__":
    write_corpus(int(sys.argv[1]), Path(sys.argv[2]))
