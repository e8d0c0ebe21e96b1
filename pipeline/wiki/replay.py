"""Replay released trajectories through our environment and measure how often it agrees.

    python -m pipeline wiki replay                                  # the three released sources
    python -m pipeline wiki replay --style clean ../shared/data/react/prompts_naive.json

Each trajectory's actions are stepped, in order, through one fresh WikiEnv (so Lookup sees the
page our Search found), and each observation is compared with the one recorded:
- same outcome: both a hit / both a miss for Search (`Could not find`), both a result / both
  `No more results.` for Lookup, both `Invalid action` otherwise;
- same first sentence: the text up to the first '. ' is equal (after stripping, and after
  dropping "Pages for logged out editors learn more. ", page chrome the original's HTML
  scraping picked up in 2022 and that no corpus has); also given over the pairs where both
  are hits / results ("of both hits"), which separates page text from page coverage;
- identical: the whole observation is equal (after stripping surrounding whitespace).
Finish is left out (its text is the reward, which depends on the gold answer, not on Wikipedia).

Sources (recognised by their shape):
- the ReAct prompts file (`prompts_naive.json`): every exemplar set with numbered `Action i:` /
  `Observation i:` lines (ReAct and Act); observations from live Wikipedia, 2022;
- ReAct's FEVER trajectories (`fever_react_davinci002_500_trajs.jsonl`, field `traj`): the same
  environment on FEVER claims, live Wikipedia 2022;
- FireAct's alpaca-format files (`output` with unnumbered `Action:` / `Observation:` lines):
  GPT-4 trajectories whose observations are Google search snippets, so they measure how far a
  different environment is from ours, not our fidelity.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.storage import utf8_lines
from pipeline.wiki.actions import env_action
from pipeline.wiki.backend import WikiBackend
from pipeline.wiki.env import WikiEnv

KINDS = ("search", "lookup", "invalid")
_NUMBERED = re.compile(r"^(Action|Observation) (\d+): ?(.*)$")
_PLAIN = re.compile(r"^(Action|Observation): ?(.*)$")
SCRAPING_CHROME = "Pages for logged out editors learn more. "


@dataclass
class Recorded:
    source: str  # which file / exemplar set
    question: str
    steps: list[tuple[str, str]]  # (action, recorded observation)


@dataclass
class Tally:
    n: int = 0
    same_outcome: int = 0
    same_first_sentence: int = 0
    identical: int = 0
    both_found: int = 0  # both a Search hit / both a Lookup result
    both_found_same_first: int = 0

    def add(self, ours: str, theirs: str, kind: str) -> None:
        self.n += 1
        self.same_outcome += outcome(ours, kind) == outcome(theirs, kind)
        same_first = first_sentence(ours) == first_sentence(theirs.removeprefix(SCRAPING_CHROME))
        self.same_first_sentence += same_first
        self.identical += ours.strip() == theirs.strip()
        if outcome(ours, kind) == outcome(theirs, kind) in ("hit", "result"):
            self.both_found += 1
            self.both_found_same_first += same_first

    def row(self) -> dict:
        def pct(k: int) -> float:
            return round(100.0 * k / self.n, 1) if self.n else 0.0

        both = round(100.0 * self.both_found_same_first / self.both_found, 1) if self.both_found else None
        return {"n": self.n, "same_outcome_pct": pct(self.same_outcome),
                "same_first_sentence_pct": pct(self.same_first_sentence), "identical_pct": pct(self.identical),
                "both_found": self.both_found, "both_found_same_first_sentence_pct": both}


@dataclass
class Report:
    tallies: dict[str, dict[str, Tally]] = field(default_factory=dict)  # source -> kind -> tally
    trajectories: dict[str, int] = field(default_factory=dict)

    def tally(self, source: str, kind: str) -> Tally:
        return self.tallies.setdefault(source, {}).setdefault(kind, Tally())

    def rows(self) -> list[dict]:
        return [{"source": source, "kind": kind, **kinds[kind].row()}
                for source, kinds in self.tallies.items() for kind in KINDS if kind in kinds]

    def markdown(self) -> str:
        lines = ["| source | action | n | same hit/miss | same first sentence | identical | of both hits: same first sentence |",
                 "|---|---|---:|---:|---:|---:|---:|"]
        for r in self.rows():
            both = "-" if r["both_found"] == 0 else f"{r['both_found_same_first_sentence_pct']}% of {r['both_found']}"
            lines.append(f"| {r['source']} ({self.trajectories[r['source']]} traj.) | {r['kind']} | {r['n']} | "
                         f"{r['same_outcome_pct']}% | {r['same_first_sentence_pct']}% | {r['identical_pct']}% | {both} |")
        return "\n".join(lines)


def outcome(observation: str, kind: str) -> str:
    text = observation.strip()
    if text.startswith("Invalid action"):
        return "invalid"
    if kind == "search":
        return "miss" if text.startswith("Could not find") else "hit"
    if kind == "lookup":
        return "none" if text.startswith("No more results") else "result"
    return "other"


def first_sentence(observation: str) -> str:
    return observation.strip().split(". ")[0].strip()


# ---------------------------------------------------------------- reading trajectories


def parse_numbered(text: str) -> list[tuple[str, str]]:
    """(action, observation) pairs of `Action i: ...` / `Observation i: ...` lines."""
    pairs, action = [], None
    for line in text.split("\n"):
        m = _NUMBERED.match(line)
        if not m:
            continue
        if m.group(1) == "Action":
            action = m.group(3).strip()
        elif action is not None:
            pairs.append((action, m.group(3)))
            action = None
    return pairs


def parse_plain(text: str) -> list[tuple[str, str]]:
    """The same for FireAct's unnumbered `Action:` / `Observation:` lines."""
    pairs, action = [], None
    for line in text.split("\n"):
        m = _PLAIN.match(line)
        if not m:
            continue
        if m.group(1) == "Action":
            action = m.group(2).strip()
        elif action is not None:
            pairs.append((action, m.group(2)))
            action = None
    return pairs


def _split_exemplars(text: str) -> Iterator[tuple[str, str]]:
    for chunk in re.split(r"\n(?=Question: )", "\n" + text):
        if chunk.startswith("Question: "):
            yield chunk.split("\n", 1)[0][len("Question: "):], chunk


def read_trajectories(path: str | Path) -> Iterator[Recorded]:
    """The recorded trajectories of one released file (module docstring), by its shape."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path}: trajectory file not found")
    name = path.name
    if path.suffix == ".jsonl":
        for lineno, line in utf8_lines(path):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PipelineError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if "traj" not in record:
                raise PipelineError(f"{path}:{lineno}: no 'traj' field (expected ReAct's FEVER trajectories)")
            yield Recorded(name, record.get("claim") or record.get("question", ""), parse_numbered(record["traj"]))
        return
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise PipelineError(f"{path}: not valid JSON ({exc.msg})") from None
    if isinstance(data, dict):  # the ReAct prompts file: exemplar sets by key
        for key, text in data.items():
            if isinstance(text, str) and "\nAction 1: " in text:
                for question, chunk in _split_exemplars(text):
                    yield Recorded(f"{name}#{key}", question, parse_numbered(chunk))
    elif isinstance(data, list) and data and isinstance(data[0], dict) and "output" in data[0]:
        for row in data:  # FireAct alpaca format
            yield Recorded(name, row.get("instruction", ""), parse_plain(row["output"]))
    else:
        raise PipelineError(f"{path}: not a ReAct prompts file, FEVER trajectories or FireAct alpaca file")


# ---------------------------------------------------------------- replaying


def replay(backend: WikiBackend, files: list[str | Path], style: str) -> Report:
    report = Report()
    for path in files:
        for recorded in read_trajectories(path):
            steps = [(a, o) for a, o in recorded.steps if a]
            if not steps:
                continue
            report.trajectories[recorded.source] = report.trajectories.get(recorded.source, 0) + 1
            env = WikiEnv(backend, max_steps=len(steps) + 1, style=style)
            env.reset(recorded.question)
            for action, theirs in steps:
                parsed = env.parse(env_action(action))
                if parsed is not None and parsed.name == "finish":
                    break
                ours, *_ = env.step(env_action(action))
                kind = parsed.name if parsed is not None and parsed.name in KINDS else "invalid"
                report.tally(recorded.source, kind).add(ours, theirs, kind)
    return report
