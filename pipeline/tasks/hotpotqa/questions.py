"""HotpotQA questions: one `Question` type, loaders for every format, and the named question sets.

Formats (detected from the content, not the file name):
  - official JSON (train / dev-distractor / dev-fullwiki): a list of {_id, question, answer, type,
    level, supporting_facts: [[title, sent_idx]], context: [[title, [sentences]]]};
  - the simplified list {question, answer, type} (ReAct's dev file; ids `dev:{index}`);
  - JSONL of official records (our with_context.jsonl; ids = `_id`);
  - Hugging Face `hotpotqa/hotpot_qa` records (context / supporting_facts as dicts of lists),
    as a `datasets.Dataset` or exported JSON / JSONL;
  - a split file written by `python -m pipeline data split` (ids resolved in with_context.jsonl).

Named sets (`load_question_set`): react-dev500 (the ReAct / FireAct eval sample), offline-eval and
offline-bootstrap (splits/offline-v1), dev, train, hf:<distractor|fullwiki>:<split>.

    python -m pipeline data show react-dev500
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT, resolve_source
from pipeline.core.storage import read_jsonl

DEV_SIZE = 7405
REACT_SEED = 233
REACT_SAMPLE_SIZE = 500
SPLITS_DIR = REPO_ROOT / "splits"
OFFLINE_SPLIT = "offline-v1"
SPLIT_FORMAT = "hotpotqa-id-list/v1"
DISTRACTOR = "distractor"
QUESTION_SETS = ("react-dev500", "offline-eval", "offline-bootstrap", "dev", "train",
                 "hf:<distractor|fullwiki>:<train|validation|test>")


@dataclass
class Question:
    """One HotpotQA question. `supporting_facts`: [title, sentence index or None];
    `context`: [title, [sentences]] paragraphs, or None when the source has none."""

    id: str
    question: str
    answer: str
    type: str | None = None
    level: str | None = None
    supporting_facts: list[list] = field(default_factory=list)
    context: list[list] | None = None
    split: str | None = None
    source: str | None = None

    @property
    def gold_titles(self) -> list[str]:
        """Titles of the supporting paragraphs, first-seen order, no repeats."""
        return list(dict.fromkeys(title for title, _ in self.supporting_facts))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Question:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


# ---------------------------------------------------------------- record converters


def from_official(rec: dict, *, split: str | None = None, source: str | None = None,
                  id: str | None = None) -> Question:
    """An official-format record (also one line of with_context.jsonl)."""
    return Question(
        id=id or str(rec["_id"]),
        question=rec["question"],
        answer=_answer(rec),
        type=rec.get("type"),
        level=rec.get("level"),
        supporting_facts=[[t, i] for t, i in rec.get("supporting_facts") or []],
        context=[[t, list(s)] for t, s in rec["context"]] if rec.get("context") is not None else None,
        split=rec.get("split", split),
        source=source,
    )


def from_simplified(rec: dict, index: int, *, split: str = "dev", source: str | None = None) -> Question:
    """A {question, answer, type} record; its id is its position in the official order."""
    return Question(id=f"{split}:{index}", question=rec["question"], answer=_answer(rec),
                    type=rec.get("type"), split=split, source=source)


def from_hf(rec: dict, *, split: str | None = None, source: str | None = None) -> Question:
    """A `hotpotqa/hotpot_qa` record: supporting_facts {title, sent_id}, context {title, sentences}."""
    facts, context = rec.get("supporting_facts") or {}, rec.get("context")
    return Question(
        id=str(rec["id"]),
        question=rec["question"],
        answer=_answer(rec),
        type=rec.get("type"),
        level=rec.get("level"),
        supporting_facts=[[t, i] for t, i in zip(facts.get("title", []), facts.get("sent_id", []), strict=True)],
        context=[[t, list(s)] for t, s in zip(context["title"], context["sentences"], strict=True)]
        if context else None,
        split=split,
        source=source,
    )


def questions_from_hf(dataset: Iterable[dict], *, split: str | None = None,
                      source: str = "hotpotqa/hotpot_qa") -> list[Question]:
    """Convert a `datasets.Dataset` (or any iterable of HF-schema records) to Questions."""
    return [from_hf(rec, split=split, source=source) for rec in dataset]


def _answer(rec: dict) -> str:
    answer = rec.get("answer")
    if answer is None:
        raise KeyError("answer")  # e.g. the unlabelled fullwiki test file: nothing to score against
    return str(answer)


def _schema(rec: Any) -> str | None:
    if not isinstance(rec, dict) or "question" not in rec:
        return None
    if "_id" in rec:
        return "official"
    if "id" in rec and isinstance(rec.get("context"), dict):
        return "hf"
    if "answer" in rec and "context" not in rec:
        return "simplified"
    return None


# ---------------------------------------------------------------- files


def detect_format(path: str | os.PathLike) -> str:
    """'official', 'simplified', 'hf' (JSON lists), 'jsonl', 'hf-jsonl', 'simplified-jsonl' or 'split'."""
    path = Path(path)
    head = _head(path)
    if head.startswith("["):
        records = _read_json(path)
        return _list_schema(path, records)
    if head.startswith("{"):
        first_line = head.split("\n", 1)[0]
        try:
            first = json.loads(first_line)
        except json.JSONDecodeError:
            first = None
        if first is None:  # a pretty-printed JSON object: maybe a split file
            obj = _read_json(path)
            if isinstance(obj, dict) and obj.get("format") == SPLIT_FORMAT:
                return "split"
            raise PipelineError(_unknown(path, obj))
        if first.get("format") == SPLIT_FORMAT:
            return "split"
        schema = _schema(first)
        if schema is None:
            raise PipelineError(_unknown(path, first, where=f"{path}:1"))
        return {"official": "jsonl", "hf": "hf-jsonl", "simplified": "simplified-jsonl"}[schema]
    raise PipelineError(_unknown(path, None))


def load_file(path: str | os.PathLike, *, split: str | None = None) -> list[Question]:
    """Load any supported file (see the module docstring); errors name the file and record."""
    path = Path(path)
    kind = detect_format(path)
    source = path.name
    if kind == "split":
        return _load_split_file(path)
    if kind in ("official", "simplified", "hf"):
        records = _read_json(path)
        where = (lambda i: f"{path}: item {i}")  # noqa: E731
    else:
        records = read_jsonl(path, tolerate_torn_tail=False)
        where = (lambda i: f"{path}:{_line_of(path, i)}")  # noqa: E731
    schema = _KIND_SCHEMA[kind]
    questions = []
    for i, rec in enumerate(records):
        if _schema(rec) != schema:
            raise PipelineError(f"{where(i)}: record does not match the file's {kind} format "
                                f"(keys: {sorted(rec) if isinstance(rec, dict) else type(rec).__name__})")
        try:
            if schema == "official":
                questions.append(from_official(rec, split=split, source=source))
            elif schema == "hf":
                questions.append(from_hf(rec, split=split, source=source))
            else:
                questions.append(from_simplified(rec, i, split=split or "dev", source=source))
        except (KeyError, TypeError, ValueError) as exc:
            raise PipelineError(f"{where(i)}: malformed {kind} record ({type(exc).__name__}: {exc}); "
                                "fix or remove it") from None
    return questions


_KIND_SCHEMA = {"official": "official", "simplified": "simplified", "hf": "hf",
                "jsonl": "official", "hf-jsonl": "hf", "simplified-jsonl": "simplified"}


def _head(path: Path, size: int = 65536) -> str:
    if not path.is_file():
        raise PipelineError(f"{path}: file not found")
    with open(path, encoding="utf-8", errors="replace") as fh:
        head = fh.read(size).lstrip("\ufeff \t\r\n")
    if not head:
        raise PipelineError(f"{path}: file is empty; expected HotpotQA questions")
    return head


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise PipelineError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno}); "
                            "the file is corrupt or truncated: re-download or fix it") from None
    except UnicodeDecodeError as exc:
        raise PipelineError(f"{path}: not UTF-8 text ({exc.reason}); is this the right file?") from None


def _list_schema(path: Path, records: list) -> str:
    if not records:
        raise PipelineError(f"{path}: the JSON list is empty; expected HotpotQA questions")
    schema = _schema(records[0])
    if schema is None:
        raise PipelineError(_unknown(path, records[0], where=f"{path}: item 0"))
    return schema


def _unknown(path: Path, sample: Any, where: str | None = None) -> str:
    keys = sorted(sample) if isinstance(sample, dict) else type(sample).__name__ if sample is not None else "no JSON"
    return (f"{where or path}: unknown format (found {keys}); expected official HotpotQA JSON "
            "(_id, question, answer, context), the simplified {question, answer, type} list, "
            "JSONL of official records, Hugging Face hotpot_qa records, or a split file")


def _line_of(path: Path, record_index: int) -> int:
    """1-based line number of the record_index-th non-blank line (only computed for errors)."""
    seen = -1
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                seen += 1
                if seen == record_index:
                    return lineno
    return record_index + 1


# ---------------------------------------------------------------- named sets


def react_dev500_indices() -> list[int]:
    """The ReAct / FireAct eval sample: dev indices shuffled by random.Random(233), first 500."""
    idx = list(range(DEV_SIZE))
    random.Random(REACT_SEED).shuffle(idx)
    return idx[:REACT_SAMPLE_SIZE]


def load_question_set(name_or_path: str | os.PathLike, *, limit: int | None = None) -> list[Question]:
    """Questions by name (see QUESTION_SETS) or from a file in any supported format.

    Named dev sets use ids `dev:{index}` (index in the official dev order); offline splits,
    train and files of official records keep HotpotQA's `_id`.
    """
    name = str(name_or_path)
    if name == "react-dev500":
        questions = load_react_dev500()
    elif name == "dev":
        questions = load_dev()
    elif name == "train":
        questions = load_file(resolve_source("hotpotqa-train"), split="train")
    elif name in ("offline-eval", "offline-bootstrap"):
        questions = _load_split_file(SPLITS_DIR / OFFLINE_SPLIT / f"{name.removeprefix('offline-')}.json")
    elif name.startswith("hf:") and name.count(":") <= 2:
        questions = load_hf(*name.split(":")[1:])
    elif Path(name).expanduser().is_file():
        questions = load_file(Path(name).expanduser())
    else:
        hint = "" if Path(name).suffix == "" else f" ({name} is not a file)"
        raise PipelineError(f"unknown question set '{name}'{hint}; use one of {', '.join(QUESTION_SETS)} "
                            "or a path to a HotpotQA file")
    if limit is not None:
        if limit < 0:
            raise PipelineError(f"limit must be >= 0, got {limit}")
        questions = questions[:limit]
    return questions


def load_dev() -> list[Question]:
    """All 7,405 dev questions, ids `dev:{index}`, with context attached where known."""
    path = _dev_source()
    questions = load_file(path, split="dev")
    if len(questions) != DEV_SIZE:
        raise PipelineError(f"{path}: {len(questions)} questions, expected the {DEV_SIZE} of HotpotQA dev; "
                            "is this the dev file?")
    for i, q in enumerate(questions):
        q.id, q.split = f"dev:{i}", "dev"
    if questions[0].context is None:
        _attach_context(questions)
    return questions


def load_react_dev500() -> list[Question]:
    """The ReAct / FireAct 500-question dev sample, in the sample's order."""
    dev = load_dev()
    return [dev[i] for i in react_dev500_indices()]


def _dev_source() -> Path:
    """Dev questions: data/ cache (official dev, then simplified) > mirror > download simplified."""
    for name in ("hotpotqa-dev-distractor", "hotpotqa-dev-simplified"):
        try:
            return resolve_source(name, download=False)
        except PipelineError:
            continue
    return resolve_source("hotpotqa-dev-simplified")


def _attach_context(dev: list[Question]) -> None:
    """Fill context / supporting facts / level from with_context.jsonl rows that carry react_dev_idx."""
    try:
        path = resolve_source("hotpotqa-with-context", download=False)
    except PipelineError:
        return  # optional enrichment: the questions and answers are complete without it
    for row in read_with_context(path):
        idx = row.get("react_dev_idx")
        if idx is None:
            continue
        q = dev[idx]
        if row["question"] != q.question:
            raise PipelineError(f"{path}: row {row['_id']} says react_dev_idx={idx} but its question differs "
                                f"from dev question {idx}; the file does not match this dev set")
        q.context = [[t, list(s)] for t, s in row["context"]]
        q.supporting_facts = [[t, i] for t, i in row["supporting_facts"]]
        q.level = row.get("level")
        q.source = f"{q.source}+{path.name}"


def read_with_context(path: str | os.PathLike) -> list[dict]:
    """Rows of with_context.jsonl (official records with context plus split, react_dev_idx, ...)."""
    path = Path(path)
    rows = read_jsonl(path, tolerate_torn_tail=False)
    for i, row in enumerate(rows):
        if _schema(row) != "official" or "context" not in row:
            raise PipelineError(f"{path}:{_line_of(path, i)}: not an official HotpotQA record with context")
    return rows


def load_hf(setting: str = "distractor", split: str = "validation") -> list[Question]:
    """`datasets.load_dataset("hotpotqa/hotpot_qa", setting, split=split)` (needs the hub)."""
    if setting not in ("distractor", "fullwiki"):
        raise PipelineError(f"hf:{setting}:{split}: the setting must be distractor or fullwiki")
    import datasets

    try:
        dataset = datasets.load_dataset("hotpotqa/hotpot_qa", setting, split=split)
    except Exception as exc:  # the hub raises many types (connection, offline mode, bad split)
        raise PipelineError(f"hf:{setting}:{split}: could not load hotpotqa/hotpot_qa from the Hugging Face "
                            f"hub ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                            "use a local file instead: python -m pipeline data fetch hotpotqa") from None
    return questions_from_hf(dataset, split=split)


# ---------------------------------------------------------------- offline split


def _load_split_file(path: Path) -> list[Question]:
    if not path.is_file():
        raise PipelineError(f"{path}: split file not found; create it with `python -m pipeline data split`")
    header = _read_json(path)
    if not isinstance(header, dict) or header.get("format") != SPLIT_FORMAT or not isinstance(header.get("ids"), list):
        raise PipelineError(f"{path}: not a split file (expected format {SPLIT_FORMAT} with an ids list)")
    rows_path = resolve_source("hotpotqa-with-context")
    by_id = {row["_id"]: row for row in read_with_context(rows_path)}
    missing = [i for i in header["ids"] if i not in by_id]
    if missing:
        raise PipelineError(f"{path}: {len(missing)} ids (e.g. {missing[0]}) are not in {rows_path}; "
                            "the split was made from a different with_context.jsonl")
    return [from_official(by_id[i], source=f"{rows_path.name}") for i in header["ids"]]


def build_offline_split(rows: Sequence[dict], corpus_titles: set[str], *, seed: int = 0,
                        eval_size: int = 500, exclude_dev_indices: Iterable[int] = ()) -> dict[str, Any]:
    """Choose the offline eval set and the bootstrap pool from with_context.jsonl rows.

    eval: `eval_size` dev rows whose supporting-fact titles are all pages of the corpus, drawn
    first from context_setting == "distractor" (seeded shuffle), then from the other settings.
    bootstrap: every train row plus the dev rows not in eval and not in `exclude_dev_indices`
    (the react-dev500 sample, kept clean for comparison with published numbers), shuffled.
    Both lists are deterministic for a given seed and row set (rows are sorted by _id first).
    """
    rows = sorted(rows, key=lambda r: r["_id"])
    excluded = set(exclude_dev_indices)
    rng = random.Random(seed)
    dev = [r for r in rows if r.get("split") == "dev"]
    eligible = [r for r in dev if r["supporting_facts"]
                and all(t in corpus_titles for t, _ in r["supporting_facts"])]
    preferred = [r for r in eligible if r.get("context_setting") == DISTRACTOR]
    others = [r for r in eligible if r.get("context_setting") != DISTRACTOR]
    rng.shuffle(preferred)
    rng.shuffle(others)
    chosen = (preferred + others)[:eval_size]
    if len(chosen) < eval_size:
        raise PipelineError(f"only {len(chosen)} dev questions have all gold paragraphs in the corpus; "
                            f"cannot pick {eval_size} (lower --eval-size or use a larger corpus)")
    eval_ids = {r["_id"] for r in chosen}
    pool = [r for r in rows if r.get("split") == "train"
            or (r.get("split") == "dev" and r["_id"] not in eval_ids and r.get("react_dev_idx") not in excluded)]
    rng.shuffle(pool)
    setting = Counter(r.get("context_setting") for r in chosen)
    counts = {
        "rows": len(rows), "dev_rows": len(dev), "train_rows": sum(r.get("split") == "train" for r in rows),
        "dev_gold_in_corpus": len(eligible), "dev_gold_in_corpus_distractor": len(preferred),
        "eval": len(chosen), "eval_by_context_setting": dict(setting),
        "bootstrap": len(pool), "bootstrap_train": sum(r.get("split") == "train" for r in pool),
        "bootstrap_dev": sum(r.get("split") == "dev" for r in pool),
        "dev_excluded_react_dev500": sum(1 for r in dev if r["_id"] not in eval_ids
                                         and r.get("react_dev_idx") in excluded),
        "eval_in_react_dev500": sum(1 for r in chosen if r.get("react_dev_idx") in excluded),
        "bootstrap_gold_in_corpus": sum(1 for r in pool if r["supporting_facts"]
                                        and all(t in corpus_titles for t, _ in r["supporting_facts"])),
    }
    return {"eval": [r["_id"] for r in chosen], "bootstrap": [r["_id"] for r in pool], "counts": counts}


def corpus_titles(path: str | os.PathLike) -> set[str]:
    """Page titles of a {title, ...} JSONL corpus (wiki/corpus.jsonl)."""
    path = Path(path)
    titles = set()
    for i, row in enumerate(read_jsonl(path, tolerate_torn_tail=False)):
        if "title" not in row:
            raise PipelineError(f"{path}:{_line_of(path, i)}: corpus record has no 'title'")
        titles.add(row["title"])
    if not titles:
        raise PipelineError(f"{path}: the corpus is empty")
    return titles


def sha256_of(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
