"""Filter: correct, finished trajectories -> one SFT dataset per method (paper: 3,000 each).

    python -m pipeline filter --config configs/demo.yaml
    python -m pipeline filter inputs=[runs/generate/demo] out_dir=runs/sft/demo tokenizer=smollm2
    python -m pipeline filter --from-fireact ../shared/data/fireact/alpaca_format/hotpotqa_multimethod.json out_dir=runs/sft/fireact

Inputs are generate output folders (`<method>.jsonl` + a complete manifest.json) and/or FireAct's
released files (pipeline.hub.importers). The shards of a sharded generation (`shard=i/n`,
pipeline.core.shards) are merged into one input, which must hold every shard 0..n-1. A generate
folder's (or shard set's) episodes are read in question-id order, so a dataset does not depend on
the order in which concurrent episodes happened to finish, nor on how the questions were sharded.
The inputs' task (their manifests' `task`: HotpotQA when older manifests name none; FireAct's
files are HotpotQA) decides what counts as correct. Per method it keeps episodes that finished
correct (HotpotQA: EM = 1; FEVER: the gold label; optionally F1 >= min_f1), drops repeated
episode ids (the first is kept) and repeated trajectories of one question (the k samples of
rejection sampling, `generate samples=k`, are episodes `<question id>#<j>`: pipeline.sampling),
keeps at most `per_question` of each question (default: every distinct trajectory), with
`match_dataset` (another SFT dataset folder) only the questions that dataset's rows of the format
answer and at most as many of each (another teacher's data on the same questions and rows: a
grid's `compare_oracle`), caps the rest at `max_per_method` by a seeded draw, with `equal_rows`
caps every format by the same draw to the smallest format's count (refused in one line where it
cannot apply: one format, a union, a matched dataset, a format that kept nothing), shuffles them with the same seed (so training batches mix
questions and sources rather than follow the generate order; `shuffle=false` keeps input order),
and writes `<out_dir>/<method>/` (docs/formats.md): train.jsonl,
failed.jsonl (every episode that ended in a backend error, did not finish, was wrong or below
min_f1, each with `why`: the data a negative-aware method trains on), README.md (dataset card),
stats.json, manifest.json. `union_with` names earlier datasets whose rows each dataset starts
from (self-training rounds, pipeline/rounds.py): a new row joins unless its text is already there. The folder appears by one rename, so a reader
never sees half a dataset. A re-run whose inputs (fingerprints) and settings match the manifest
skips the method; `force=true` rebuilds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pipeline.core.config import (
    add_config_arguments,
    bound,
    check,
    distinct,
    in_range,
    stage_config,
    to_dict,
)
from pipeline.core.errors import PipelineError
from pipeline.core.messages import dataset_rows
from pipeline.core.same_run import run_keys, same_run
from pipeline.core.storage import (
    TMP_SUFFIX,
    check_writable_dir,
    file_fingerprint,
    is_done,
    read_jsonl,
    read_manifest,
    remove_stale_temps,
    require_complete,
    temp_prefix,
    write_manifest,
)
from pipeline.core.trajectory import FORMATS, Trajectory, render
from pipeline.hub.models import load_tokenizer
from pipeline.tasks import Task, get_task, task_of

REQUIRED_FIELDS = ("id", "method", "em", "finished", "trajectory")
# Why an episode was not kept, in the order the checks run ("error": a backend error ended it).
DROP_REASONS = ("error", "unfinished", "incorrect", "low_f1", "bad_trajectory", "duplicate", "over_per_question",
                "other_question", "over_matched", "over_cap", "over_equal_rows")
# The episodes that failed (the model's, or a backend's, doing), written to failed.jsonl with `why`;
# the others were dropped as data problems (bad_trajectory) or as surplus correct ones.
FAILED_REASONS = ("error", "unfinished", "incorrect", "low_f1")
FAILED_FILE = "failed.jsonl"
MESSAGES_FILE = "messages.jsonl"  # the same rows as chat messages with tool calls (pipeline/core/messages.py)
# The generate config keys that make shards parts of one run: GenerateConfig's fields marked
# shard_set (pipeline.core.same_run); named here because a stage imports no sibling stage, and
# held equal to them by tests/test_config.py.
SHARD_SET_KEYS = ("task", "teacher", "oracle", "questions", "prompting", "wiki", "samples", "limit")
GLOBAL_BATCH = 64  # the paper's batch size, for the epochs the dataset card reports


@dataclass
class FilterConfig:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"methods": "formats"}  # old key -> new (pipeline.core.config)

    inputs: list[str] = same_run("input", default_factory=list)  # generate output folders
    # FireAct alpaca .json / gpt .jsonl files or folders, or any .jsonl of chat messages with tool calls
    fireact: list[str] = same_run("input", default_factory=list)
    fireact_other_tasks: bool = same_run("identity", default=False)  # keep non-HotpotQA questions of FireAct's multitask files
    # SFT dataset folders (this stage's out_dirs) whose <method>/train.jsonl rows come first in each
    # dataset, the new episodes' rows added unless already there (self-training's union of rounds);
    # max_per_method caps the new rows only. Checked by fingerprint, as the inputs are.
    union_with: list[str] = same_run("input", default_factory=list)
    # An SFT dataset folder (this stage's out_dir) to match, per format: keep only episodes of the
    # questions its <format>/train.jsonl rows answer, at most as many of a question as it has rows
    # of it (so at most its row count): another teacher's data on the same questions and rows (a
    # grid's `compare_oracle`). Fewer where these inputs solved fewer of them: stats say how many.
    match_dataset: str | None = same_run("input", default=None)
    out_dir: str = same_run("free", default="runs/sft")
    formats: list[str] = same_run("free", metadata=check(distinct), default_factory=list)  # the training formats to build; empty: every one the inputs hold
    min_f1: float | None = same_run("identity", default=None, metadata=check(in_range(0, 1)))  # also require F1 >= this (EM = 1 is always required)
    require_finished: bool = same_run("identity", default=True)
    max_per_method: int = same_run("identity", default=3000, metadata=bound(1))
    # Correct trajectories kept per question (k samples of one question, pipeline.sampling):
    # null = every distinct one; 1 = the first
    per_question: int | None = same_run("identity", default=None, metadata=bound(1))
    seed: int = same_run("identity", default=0, metadata=bound(0))
    # true: every format gets the same number of rows, each capped by the seeded draw to the
    # smallest format's kept count (after max_per_method), so formats differ in content, not in amount
    equal_rows: bool = same_run("identity", default=False)
    shuffle: bool = same_run("identity", default=True)  # the written order: seeded shuffle (True) or input order
    tokenizer: str | None = same_run("identity", default=None)  # "smollm2", a local folder or a hub id: token-length stats
    force: bool = same_run("free", default=False)


CONTENT_KEYS = run_keys(FilterConfig)
# Identity keys added after datasets were built: in the key only when set, so a dataset built
# before them is still up to date (rebuilt, its new file would make every training on it run again)
LATER_KEYS = ("equal_rows",)


@dataclass
class Episodes:
    """What the inputs hold: episodes by method in input order, and the task they answer."""

    by_method: dict[str, list[dict]]
    fingerprints: list[dict]
    fireact_reports: list[dict]
    task: Task


@dataclass
class Selection:
    """One method's outcome: the kept episodes and why the others went."""

    method: str
    kept: list[dict]
    seen: int
    dropped: Counter
    failed: list[tuple[dict, str]] = field(default_factory=list)  # (episode, why: a FAILED_REASONS name)


# ---------------------------------------------------------------- reading inputs


def collect_episodes(cfg: FilterConfig) -> Episodes:
    """Every input's episodes by method in input order, the inputs' fingerprints, FireAct import
    reports, and the one task they all answer."""
    by_method: dict[str, list[dict]] = {}
    fingerprints: list[dict] = []
    reports: list[dict] = []
    groups = generate_inputs(cfg.inputs)
    task = inputs_task(cfg)
    inputs_search(cfg)  # one search mode, refused before anything is read or written
    for folders in groups:
        merged: dict[str, list[dict]] = {}
        for folder in folders:
            for path, episodes in _read_generate_folder(folder, cfg.formats):
                fingerprints.append(file_fingerprint(path))
                for episode in episodes:
                    merged.setdefault(episode["method"], []).append(episode)
        for method, episodes in merged.items():
            by_method.setdefault(method, []).extend(sorted(episodes, key=lambda e: str(e["id"])))
    if cfg.fireact:
        from pipeline.hub.importers import find_fireact_files, read_fireact_trajectories

        for path in (f for p in cfg.fireact for f in find_fireact_files(p)):
            episodes, report = read_fireact_trajectories(path, other_tasks=cfg.fireact_other_tasks)
            print(report.line())
            fingerprints.append(file_fingerprint(path))
            reports.append(report.to_dict())
            for episode in episodes:
                by_method.setdefault(episode["method"], []).append(episode)
    return Episodes(by_method, fingerprints, reports, task)


def inputs_task(cfg: FilterConfig) -> Task:
    """The one task the inputs answer: each generate folder's manifest names it (HotpotQA when it
    is older than the key); FireAct's files are HotpotQA questions."""
    tasks = {str(folder): task_of(read_manifest(Path(folder) / "manifest.json")) for folder in cfg.inputs}
    tasks.update({str(path): "hotpotqa" for path in cfg.fireact})
    if len(set(tasks.values())) > 1:
        raise PipelineError("filter: the inputs answer different tasks ("
                            + ", ".join(f"{where}: {name}" for where, name in tasks.items())
                            + "); build one dataset per task")
    return get_task(next(iter(tasks.values()), None))


def inputs_search(cfg: FilterConfig) -> str:
    """The one wiki.search mode the generate inputs' observations were made in ("title" without
    any: FireAct's files, older runs); one dataset never mixes the two."""
    from pipeline.wiki.config import search_of

    modes = {search_of(read_manifest(Path(folder) / "manifest.json")) for folder in cfg.inputs} or {"title"}
    if len(modes) > 1:
        raise PipelineError(f"filter: the inputs searched in different wiki.search modes ({', '.join(sorted(modes))}); "
                            "build one dataset per mode")
    return modes.pop()


def generate_inputs(inputs: list[str]) -> list[list[Path]]:
    """The generate folders as inputs in order: an unsharded folder alone, the folders of one
    shard set together (at the place of its first), checked complete (pipeline.core.shards)."""
    from pipeline.agent.answerers import upgrade_oracle
    from pipeline.agent.run_folder import identity
    from pipeline.core.shards import check_shard_set, parse_shard

    groups: dict[str, list[tuple[Path, object]]] = {}
    for folder in map(Path, inputs):
        if not folder.is_dir():
            raise PipelineError(f"inputs: {folder} is not a folder; give a generate output folder")
        manifest = require_complete(folder / "manifest.json", f"generate output {folder}")
        config = manifest.get("config") or {}
        shard = parse_shard(config.get("shard"))
        if shard is None:
            groups[f"folder:{folder}"] = [(folder, None)]
            continue
        key = json.dumps(identity(upgrade_oracle(config), SHARD_SET_KEYS), sort_keys=True, default=str)
        groups.setdefault(key, []).append((folder, shard))
    out = []
    for members in groups.values():
        if members[0][1] is not None:
            check_shard_set([(shard, str(folder)) for folder, shard in members], "filter inputs")
        out.append([folder for folder, _ in members])
    return out


def _read_generate_folder(folder: Path, formats: list[str]) -> list[tuple[Path, list[dict]]]:
    """The folder's training-format files and their episodes, each checked against the count its
    manifest gives (of `formats`, or of every format when empty)."""
    if not folder.is_dir():
        raise PipelineError(f"inputs: {folder} is not a folder; give a generate output folder")
    manifest = require_complete(folder / "manifest.json", f"generate output {folder}")
    out = []
    for path in sorted(folder.glob("*.jsonl")):
        if path.stem not in FORMATS:
            # CoT-SC and hybrids are eval-time methods: no training format of their own
            print(f"note: {path} skipped (method '{path.stem}' is not a training format: {', '.join(FORMATS)})")
            continue
        episodes = read_jsonl(path)
        for i, episode in enumerate(episodes, 1):
            missing = [k for k in REQUIRED_FIELDS if k not in episode]
            if missing:
                raise PipelineError(f"{path}: record {i} lacks {', '.join(missing)}; not an episode record (docs/formats.md)")
            episode.setdefault("source", "generate")
        out.append((path, episodes))
    check_counts(folder, manifest, {path.stem: len(episodes) for path, episodes in out}, formats)
    if not out:
        raise PipelineError(f"{folder}: no <method>.jsonl files ({', '.join(FORMATS)}); is it a generate output folder?")
    return out


def check_counts(folder: Path, manifest: dict, found: dict[str, int], formats: list[str]) -> None:
    """Refuse a training format whose file is missing or holds fewer episodes than the folder's
    complete manifest counts: the file was lost, emptied or cut after the run, and building the
    datasets without that method (or with part of it) would pass for the run's result. A format
    left out by `formats` is not read, so not checked; a manifest older than its counts, neither."""
    for method, stats in (manifest.get("stats") or {}).items():
        counted = stats.get("n") if isinstance(stats, dict) else None
        if method not in FORMATS or (formats and method not in formats) or not isinstance(counted, int):
            continue
        path, held = folder / f"{method}.jsonl", found.get(method, 0)
        if held < counted:
            others = ",".join(m for m in FORMATS if m != method and m in manifest["stats"])
            state = "is missing" if not path.exists() else "is empty" if held == 0 else f"holds {held} episodes"
            raise PipelineError(f"filter: {path} {state}, but {folder / 'manifest.json'} counts {counted} {method} "
                                f"episodes; re-run the same generate into {folder} (it writes the missing ones "
                                f"again), or leave {method} out with formats=[{others}]")


# ---------------------------------------------------------------- selecting


def select(method: str, episodes: list[dict], cfg: FilterConfig, task: Task | None = None,
           rows_cap: int | None = None, matched: Counter | None = None) -> Selection:
    """Keep finished, correct (the task's rule: HotpotQA EM = 1; and F1 >= min_f1) episodes: the
    first of each episode id and of each trajectory of a question, at most `per_question` of one
    question, only the questions of `matched` (question id -> that dataset's rows of it) and at
    most as many of each, at most N, then at most `rows_cap` (equal_rows); the failed ones are set
    apart with why."""
    from pipeline.sampling import question_id

    task = get_task(task)
    dropped: Counter = Counter()
    eligible, failed, failed_ids = [], [], set()
    seen_ids, seen_texts, per_question = set(), set(), Counter()
    for episode in episodes:
        reason = _drop_reason(episode, method, cfg, task)
        if reason in FAILED_REASONS and episode["id"] not in failed_ids:
            failed.append((episode, reason))
            failed_ids.add(episode["id"])
        if reason is None:
            reason = _surplus_reason(episode, cfg, seen_ids, seen_texts, per_question)
        if reason is None and matched is not None:
            reason = _unmatched_reason(episode, matched, per_question)
        if reason:
            dropped[reason] += 1
            continue
        seen_ids.add(episode["id"])
        per_question[question_id(episode)] += 1
        eligible.append(episode)
    kept = _seeded_cap(eligible, cfg.max_per_method, cfg.seed, dropped, "over_cap")
    if rows_cap is not None:
        kept = _seeded_cap(kept, rows_cap, cfg.seed, dropped, "over_equal_rows")
    if cfg.shuffle:  # the trainer reads the file in order: mix questions (and sources) here
        kept = list(kept)
        random.Random(f"{cfg.seed}:shuffle:{method}").shuffle(kept)
    return Selection(method, kept, len(episodes), dropped, failed)


def _seeded_cap(episodes: list[dict], cap: int, seed: int, dropped: Counter, why: str) -> list[dict]:
    """At most `cap` of the episodes, drawn with the seed, in their order; the rest counted as `why`."""
    if len(episodes) <= cap:
        return episodes
    chosen = sorted(random.Random(seed).sample(range(len(episodes)), cap))
    dropped[why] = len(episodes) - cap
    return [episodes[i] for i in chosen]


def _unmatched_reason(episode: dict, matched: Counter, per_question: Counter) -> str | None:
    """Why a correct episode is not kept under `match_dataset`: that dataset has no row of its
    question, or as many of it are kept already as it has rows of it."""
    from pipeline.sampling import question_id

    qid = question_id(episode)
    if qid not in matched:
        return "other_question"
    return "over_matched" if per_question[qid] >= matched[qid] else None


def _surplus_reason(episode: dict, cfg: FilterConfig, seen_ids: set, seen_texts: set,
                    per_question: Counter) -> str | None:
    """Why a correct episode is not needed: its id was seen (the same episode twice), its
    question already has this very trajectory, or `per_question` of them."""
    from pipeline.sampling import question_id

    if episode["id"] in seen_ids:
        return "duplicate"
    text = render(Trajectory.from_dict(episode["trajectory"])).text  # the question line and the trajectory
    if text in seen_texts:
        return "duplicate"
    seen_texts.add(text)
    if cfg.per_question is not None and per_question[question_id(episode)] >= cfg.per_question:
        return "over_per_question"
    return None


def paper_epochs(method: str, examples: int) -> dict[str, float]:
    """Epochs the paper's step counts make over `examples` rows at batch 64, per size class."""
    from pipeline.train.config import PAPER_STEPS

    if examples < 1:
        return {}
    return {size: round(steps[method] * GLOBAL_BATCH / examples, 1)
            for size, steps in PAPER_STEPS.items() if method in steps}


def _drop_reason(episode: dict, method: str, cfg: FilterConfig, task: Task) -> str | None:
    from pipeline.methods.base import ended_in_error

    if ended_in_error(episode.get("end_reason")):
        return "error"
    if cfg.require_finished and not episode.get("finished"):
        return "unfinished"
    if not task.is_correct(episode):
        return "incorrect"
    if cfg.min_f1 is not None and float(episode.get("f1") or 0.0) < cfg.min_f1:
        return "low_f1"
    try:
        traj = Trajectory.from_dict(episode["trajectory"])
        render(traj)
    except (KeyError, TypeError, ValueError):
        return "bad_trajectory"
    if traj.format != method or not (traj.answer or "").strip():
        return "bad_trajectory"
    return None


def sft_example(episode: dict) -> dict:
    """One training row (docs/formats.md: SFT dataset): the renderer's prompt/completion and observation spans."""
    traj = Trajectory.from_dict(episode["trajectory"])
    rendered = render(traj)
    return {
        "id": episode["id"], "question": traj.question, "method": traj.format,
        "prompt": rendered.prompt, "completion": rendered.completion,
        "observation_spans": [list(span) for span in rendered.observation_spans],
        "answer": traj.answer, "source": episode.get("source", "generate"),
    }


def failed_row(episode: dict, why: str) -> dict:
    """One row of failed.jsonl: the episode as a training row would render it, why it failed,
    and what it answered."""
    from pipeline.sampling import question_id

    traj = Trajectory.from_dict(episode["trajectory"])
    rendered = render(traj)
    return {"id": episode["id"], "question_id": question_id(episode), "question": traj.question,
            "method": traj.format, "why": why, "end_reason": episode.get("end_reason"),
            "prediction": episode.get("prediction"), "gold_answer": episode.get("gold_answer"),
            "em": episode.get("em"), "f1": episode.get("f1"), "prompt": rendered.prompt,
            "completion": rendered.completion,
            "observation_spans": [list(span) for span in rendered.observation_spans],
            "source": episode.get("source", "generate")}


# ---------------------------------------------------------------- statistics


def summarize(values: list[float]) -> dict[str, float] | None:
    """min / mean / p50 / p95 / max (nearest-rank percentiles)."""
    if not values:
        return None
    ordered = sorted(values)

    def rank(p: float) -> float:
        return ordered[max(0, min(len(ordered) - 1, round(p * len(ordered) + 0.5) - 1))]

    return {"min": ordered[0], "mean": round(statistics.fmean(ordered), 2), "p50": rank(0.50),
            "p95": rank(0.95), "max": ordered[-1]}


def token_lengths(examples: list[dict], tokenizer) -> list[int]:
    """Tokens per example exactly as training builds it (pipeline.train.sft: prompt with the tokenizer's
    special tokens, completion, EOS), so these stats size `max_length` for the trainer."""
    from tqdm import tqdm

    from pipeline.train.sft import tokenize_example

    return [len(tokenize_example(tokenizer, e["prompt"], e["completion"])["input_ids"])
            for e in tqdm(examples, desc="token lengths", unit="ex", leave=False, disable=len(examples) < 1000)]


def dataset_stats(selection: Selection, examples: list[dict], tokenizer=None, tokenizer_name: str | None = None) -> dict:
    steps = Counter(len(Trajectory.from_dict(e["trajectory"]).steps) for e in selection.kept)
    stats: dict[str, Any] = {
        "method": selection.method,
        "seen": selection.seen,
        "kept": len(examples),
        "dropped": {r: selection.dropped[r] for r in DROP_REASONS if selection.dropped[r]},
        "failed": dict(Counter(why for _, why in selection.failed)),  # rows of failed.jsonl, by why
        "sources": dict(Counter(e["source"] for e in examples)),
        "steps": {"histogram": {str(k): steps[k] for k in sorted(steps)},
                  "mean": round(statistics.fmean(steps.elements()), 2) if selection.kept else None},
        "chars": summarize([len(e["prompt"]) + len(e["completion"]) for e in examples]),
        "tokens": None,
    }
    if tokenizer is not None:
        stats["tokens"] = {"tokenizer": tokenizer_name, "counted": "prompt (with special tokens) + completion + EOS, as pipeline.train.sft tokenizes",
                           **(summarize(token_lengths(examples, tokenizer)) or {})}
    return stats


def matched_text(m: dict) -> str:
    """What match_dataset made of one format, one clause (stats line and card)."""
    text = f"matched to {m['dataset']}: {m['rows']} of its {m['its_rows']} rows, {m['questions']} of its {m['its_questions']} questions"
    if m["rows_short"]:
        text += (f" ({m['rows_short']} rows short: {m['questions_unsolved']} of its questions unsolved here, "
                 "others solved in fewer distinct trajectories)")
    return text


def stats_line(stats: dict) -> str:
    dropped = ", ".join(f"{r} {n}" for r, n in stats["dropped"].items()) or "none"
    steps = " ".join(f"{k}:{v}" for k, v in stats["steps"]["histogram"].items())
    line = f"{stats['method']}: kept {stats['kept']} / {stats['seen']} seen (dropped: {dropped})"
    if "union" in stats:
        line += f" = {stats['union']['rows_from_them']} earlier rows + {stats['union']['new_rows']} new"
    if "equal_rows" in stats:
        eq = stats["equal_rows"]
        line += f"; equal_rows: {eq['rows']} rows each (the smallest: {', '.join(eq['smallest'])}; {eq['kept_before']} here before)"
    if "matched" in stats:
        line += "; " + matched_text(stats["matched"])
    if steps and steps != f"0:{stats['kept']}":
        line += f"; steps {steps}"
    left_out = (stats.get("messages") or {}).get("left_out")
    if left_out:
        line += f"; not in {MESSAGES_FILE} (no tool-call form): {', '.join(f'{r} {n}' for r, n in left_out.items())}"
    tokens = stats.get("tokens")
    if tokens:
        line += (f"; tokens ({tokens['tokenizer']}) min {tokens['min']} mean {tokens['mean']} "
                 f"p50 {tokens['p50']} p95 {tokens['p95']} max {tokens['max']}")
    elif stats["chars"]:
        line += f"; chars p50 {stats['chars']['p50']} max {stats['chars']['max']} (no tokenizer configured)"
    return line


# ---------------------------------------------------------------- writing


def format_card(stats: dict, cfg: FilterConfig, task: Task | None = None) -> str:
    """README.md of one format's folder (sft/<format>/): what was kept and how. The card of a
    published dataset (every format) is pipeline.hub.cards.dataset_card."""
    task = get_task(task)
    method = stats["method"]
    sources = ", ".join(f"{s} ({n})" for s, n in stats["sources"].items())
    fireact = any(s.startswith("fireact") for s in stats["sources"])
    lines = [
        f"# SFT dataset: {task.title}, {method} trajectories",
        "",
        f"{stats['kept']} training examples kept of {stats['seen']} seen. Sources: {sources}.",
        "",
        *([f"A union: the {stats['union']['rows_from_them']} rows of {', '.join(stats['union']['datasets'])} "
           f"first, then {stats['union']['new_rows']} new rows (a new row whose text is already there is "
           "not added again).", ""] if "union" in stats else []),
        "Rows: `{id, question, method, prompt, completion, observation_spans, answer, source}`.",
        "`prompt` is the question line, `completion` the trajectory as pipeline.core.trajectory renders it",
        "(append the tokenizer's EOS token at tokenization); `observation_spans` are [start, end)",
        "character offsets of observation text inside `completion`, for optional loss masking.",
        "",
        *messages_card_lines(stats),
        f"Selection (pipeline.stages.filter): finished episodes with {task.correct_rule}"
        + (f" and F1 >= {cfg.min_f1}" if cfg.min_f1 is not None else "")
        + "; repeated episode ids and repeated trajectories of a question dropped (first kept)"
        + (f"; at most {cfg.per_question} per question" if cfg.per_question is not None else "")
        + ("; " + matched_text(stats["matched"]) if "matched" in stats else "")
        + f"; at most {cfg.max_per_method} by a seeded draw"
        + (f", then {stats['equal_rows']['rows']} (equal_rows: every format as many as the smallest, "
           f"{', '.join(stats['equal_rows']['smallest'])})" if "equal_rows" in stats else "")
        + f" (seed {cfg.seed}). Drops: {json.dumps(stats['dropped'])}.",
        "",
        f"`{FAILED_FILE}`: the {sum(stats['failed'].values())} episodes that failed, each with `why` "
        f"({', '.join(FAILED_REASONS)}; {json.dumps(stats['failed'])}), in the same rendering plus "
        "`end_reason`, `prediction` and `gold_answer`: data for methods that learn from failures too.",
        "",
        ("Row order: shuffled with the seed, so batches mix questions." if cfg.shuffle
         else "Row order: the inputs' order (shuffle=false)."),
    ]
    epochs = paper_epochs(method, stats["kept"])
    if epochs:
        schedule = "; ".join(f"{size.upper()}-class students: {epochs[size]} epochs" for size in epochs)
        lines += ["", f"Training at the paper's step counts (batch {GLOBAL_BATCH}) makes {schedule} over these "
                  f"{stats['kept']} rows (steps x {GLOBAL_BATCH} / rows)."]
    if fireact:
        lines += ["", "FireAct rows: GPT-4 trajectories released by FireAct (Chen et al. 2023). Their observations",
                  "are Google search snippets, not this project's Wikipedia environment; no gold answers were",
                  "released, so correctness is FireAct's own finish reward."]
    lines += ["", f"{task.data_kind.capitalize()}: {task.citation}, {task.licence}.", "",
              "    datasets.load_dataset(\"json\", data_files=\"train.jsonl\")     # prompt / completion",
              f"    datasets.load_dataset(\"json\", data_files=\"{MESSAGES_FILE}\")  # messages / tools", ""]
    return "\n".join(lines)


def messages_card_lines(stats: dict) -> list[str]:
    """What the card says of messages.jsonl (docs/formats.md, "Messages layout")."""
    layout = stats.get("messages") or {}
    left_out = layout.get("left_out") or {}
    return [f"`{MESSAGES_FILE}`: the same {layout.get('rows', 0)} trajectories as chat `messages` with `tool_calls` "
            "and `role: tool` observations, plus `tools` (JSON schemas of search, lookup, finish), for chat "
            "templates and TRL's SFTTrainer (`assistant_only_loss=True`); the final answer is a `finish` call."
            + (f" Left out, having no tool-call form: {json.dumps(left_out)}." if left_out else ""), ""]


def write_dataset_dir(target: Path, files: dict[str, str], manifest: dict) -> None:
    """Write every file into a temporary folder beside `target`, then swap it in by rename."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(target.name), suffix=TMP_SUFFIX, dir=target.parent))
    old = None
    try:
        for name, text in files.items():
            with open(tmp / name, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
        write_manifest(tmp / "manifest.json", **manifest)
        (tmp / "manifest.json").chmod(0o644)  # mkstemp/mkdtemp create owner-only files
        tmp.chmod(0o755)
        if target.exists():
            old = target.with_name(f"{temp_prefix(target.name)}old{TMP_SUFFIX}")  # cleaned up if killed
            os.replace(target, old)
        try:
            os.replace(tmp, target)
        except OSError:
            if old is not None:  # put the previous dataset back rather than lose it
                os.replace(old, target)
                old = None
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def union_inputs(cfg: FilterConfig, methods: list[str]) -> list[dict]:
    """The fingerprints of the `union_with` datasets' files, each checked complete."""
    out = []
    for folder in map(Path, cfg.union_with):
        for method in methods:
            require_complete(folder / method / "manifest.json", f"union_with: SFT dataset {folder / method}")
            out.append(file_fingerprint(folder / method / "train.jsonl"))
    return out


def match_inputs(cfg: FilterConfig, methods: list[str]) -> list[dict]:
    """The fingerprint of match_dataset's file of each format: a changed teacher dataset rebuilds this one."""
    if cfg.match_dataset is None:
        return []
    folder = Path(cfg.match_dataset)
    return [file_fingerprint(folder / m / "train.jsonl") for m in methods if (folder / m / "train.jsonl").is_file()]


def union_rows(cfg: FilterConfig, method: str, new: list[dict]) -> tuple[list[dict], dict]:
    """The `union_with` datasets' rows, then each new row whose text (prompt and completion) is not
    among them, shuffled with the seed; and how many came from where."""
    rows, texts = [], set()
    for folder in map(Path, cfg.union_with):
        for row in read_jsonl(folder / method / "train.jsonl"):
            if row["prompt"] + row["completion"] not in texts:
                texts.add(row["prompt"] + row["completion"])
                rows.append(row)
    earlier = len(rows)
    rows += [r for r in new if r["prompt"] + r["completion"] not in texts]
    if cfg.shuffle:
        random.Random(f"{cfg.seed}:union:{method}").shuffle(rows)
    return rows, {"datasets": list(cfg.union_with), "rows_from_them": earlier, "new_rows": len(rows) - earlier}


def failed_lines(selection: Selection) -> str:
    return "".join(json.dumps(failed_row(e, why), ensure_ascii=False) + "\n" for e, why in selection.failed)


def dataset_manifest(cfg: FilterConfig, task: Task, method: str, inputs: list[dict], stats: dict,
                     reports: list[dict], equal: dict | None = None) -> dict:
    return {"stage": "filter", "config": to_dict(cfg), "complete": True, "task": task.name, "format": method,
            "search": inputs_search(cfg),  # the observations' search mode: eval refuses a student the other
            "inputs": inputs, "settings": content_key(cfg, equal),
            "counts": {"seen": stats["seen"], "kept": stats["kept"]}, "fireact_imports": reports,
            **{k: stats[k] for k in ("equal_rows", "matched") if k in stats}}


def content_key(cfg: FilterConfig, equal: dict | None = None) -> dict:
    """The settings that change a dataset's content (FilterConfig's identity fields; the inputs
    are checked by fingerprint; out_dir, force, formats change nothing, but for equal_rows'
    cap, which the formats built decide: it is part of the key)."""
    settings = to_dict(cfg)
    key = {k: settings[k] for k in CONTENT_KEYS if k not in LATER_KEYS or settings[k]}
    return {**key, **({"equal_rows_cap": equal["rows"]} if equal else {})}


def is_up_to_date(folder: Path, inputs: list[dict], cfg: FilterConfig, equal: dict | None = None) -> bool:
    return (is_done(folder / "manifest.json", inputs=inputs, settings=content_key(cfg, equal))
            and (folder / "train.jsonl").exists() and (folder / MESSAGES_FILE).exists())


# ---------------------------------------------------------------- the stage


def check_settings(cfg: FilterConfig) -> None:
    """What filter refuses about its own settings, reading nothing (`run` checks every filter
    unit's when it makes its plan)."""
    if not cfg.inputs and not cfg.fireact:
        raise PipelineError("filter: nothing to read; set inputs=[<generate output folder>] or pass --from-fireact PATH")
    if cfg.max_per_method < 1:
        raise PipelineError(f"filter: max_per_method must be >= 1, got {cfg.max_per_method}")
    unknown = [m for m in cfg.formats if m not in FORMATS]
    if unknown:
        raise PipelineError(f"filter: formats {unknown} are not training formats; choose from {list(FORMATS)}")
    if cfg.equal_rows:
        check_equal_rows(cfg)


def check_equal_rows(cfg: FilterConfig) -> None:
    """Where equal_rows cannot apply: one format (nothing to equal), a union (its earlier rows are
    not drawn again), a matched dataset (whose counts the rows follow instead)."""
    why = ("formats names one format: nothing to make equal" if len(cfg.formats) == 1
           else "union_with adds each format's earlier rows, which the draw does not cap" if cfg.union_with
           else "match_dataset already gives each format that dataset's row count" if cfg.match_dataset else None)
    if why:
        raise PipelineError(f"filter: equal_rows cannot apply: {why}; drop equal_rows (or set max_per_method to one cap)")


def equal_rows_cap(cfg: FilterConfig, methods: list[str], selections: dict[str, Selection]) -> dict | None:
    """equal_rows: the smallest format's kept count, each format's cap (None when off). A format
    that kept nothing would empty every dataset: refused, before anything is written."""
    if not cfg.equal_rows:
        return None
    if len(methods) < 2:
        raise PipelineError(f"filter: equal_rows cannot apply: the inputs hold one format ({methods[0]}): nothing to "
                            "make equal; drop equal_rows")
    kept = {m: len(selections[m].kept) for m in methods}
    rows = min(kept.values())
    smallest = [m for m in methods if kept[m] == rows]
    if rows == 0:
        raise PipelineError(f"filter: equal_rows: {', '.join(smallest)} kept no episode, so every format would get 0 "
                            f"rows; leave {', '.join(smallest)} out of formats, or drop equal_rows")
    return {"rows": rows, "smallest": smallest, "kept_before": kept}


def matched_questions(cfg: FilterConfig, method: str) -> Counter | None:
    """match_dataset's rows of `method` by question id (None without one); a format it has no
    dataset of is refused."""
    if cfg.match_dataset is None:
        return None
    from pipeline.sampling import question_of_row

    folder = Path(cfg.match_dataset) / method
    what = f"match_dataset: SFT dataset {folder} (its filter kept no {method} episode, or has not run)"
    require_complete(folder / "manifest.json", what)
    if not (folder / "train.jsonl").is_file():  # a format that kept nothing leaves only its failed episodes
        raise PipelineError(f"{what}: it has no train.jsonl; leave {method} out of formats")
    return Counter(question_of_row(row) for row in read_jsonl(folder / "train.jsonl"))


def match_stats(cfg: FilterConfig, matched: Counter, examples: list[dict]) -> dict:
    """How close the match came: the matched dataset's rows and questions, and this one's."""
    from pipeline.sampling import question_of_row

    questions = {question_of_row(e) for e in examples}
    return {"dataset": str(cfg.match_dataset), "its_rows": sum(matched.values()), "its_questions": len(matched),
            "rows": len(examples), "questions": len(questions), "questions_unsolved": len(matched) - len(questions),
            "rows_short": sum(matched.values()) - len(examples)}


def run_filter(cfg: FilterConfig, allow_empty: bool = False) -> dict:
    """Build every method's dataset; returns {method: stats} (stats of skipped methods are re-read).
    A method that keeps nothing gets no dataset; when none keeps anything that is an error, unless
    `allow_empty` (a self-training round whose student solved nothing: pipeline/rounds.py)."""
    check_settings(cfg)
    check_writable_dir(cfg.out_dir)
    remove_stale_temps(cfg.out_dir)  # a killed run's half-written dataset folders and manifest
    episodes = collect_episodes(cfg)
    search = inputs_search(cfg)  # the tools column's search tool says what this mode's Search does
    by_method, inputs, reports, task = episodes.by_method, episodes.fingerprints, episodes.fireact_reports, episodes.task
    methods = cfg.formats or [m for m in FORMATS if m in by_method]
    missing = [m for m in methods if m not in by_method]
    if missing or not methods:
        raise PipelineError(f"filter: no input episodes for {missing or 'any method'} "
                            f"(inputs hold: {sorted(by_method) or 'nothing'})")
    inputs = inputs + union_inputs(cfg, methods) + match_inputs(cfg, methods)
    matched = {m: matched_questions(cfg, m) for m in methods}
    selections = {m: select(m, by_method[m], cfg, task, matched=matched[m]) for m in methods} if cfg.equal_rows else {}
    equal = equal_rows_cap(cfg, methods, selections)
    out_dir = Path(cfg.out_dir)
    tokenizer = None
    results, empty = {}, []
    for method in methods:
        folder = out_dir / method
        if not cfg.force and is_up_to_date(folder, inputs, cfg, equal):
            results[method] = json.loads((folder / "stats.json").read_text(encoding="utf-8"))
            print(f"{method}: up to date ({folder}/manifest.json matches the inputs); force=true rebuilds")
            continue
        selection = select(method, by_method[method], cfg, task, rows_cap=equal and equal["rows"],
                           matched=matched[method])
        examples = [sft_example(e) for e in selection.kept]
        union = None
        if cfg.union_with:
            examples, union = union_rows(cfg, method, examples)
        if not examples:
            empty.append(method)
            print(f"warning: {method}: 0 of {selection.seen} episodes kept ({dict(selection.dropped)}); no dataset written")
            if folder.is_dir():  # a dataset from earlier inputs would now be a lie
                shutil.rmtree(folder)
                print(f"removed the stale {folder}")
            if selection.failed:  # still the data of what failed: the folder without a train.jsonl
                stats = dataset_stats(selection, examples)
                write_dataset_dir(folder, {FAILED_FILE: failed_lines(selection), "stats.json": json.dumps(stats, indent=2) + "\n"},
                                  dataset_manifest(cfg, task, method, inputs, stats, reports, equal))
                print(f"{method}: the {len(selection.failed)} failed episodes are in {folder / FAILED_FILE}")
            continue
        if cfg.tokenizer and tokenizer is None:
            tokenizer = load_tokenizer(cfg.tokenizer, key="filter.tokenizer")
        stats = dataset_stats(selection, examples, tokenizer, cfg.tokenizer)
        if union is not None:
            stats["union"] = union
        if equal is not None:
            stats["equal_rows"] = {"rows": equal["rows"], "smallest": equal["smallest"],
                                   "kept_before": equal["kept_before"][method]}
        if matched[method] is not None:
            stats["matched"] = match_stats(cfg, matched[method], examples)
        messages, left_out = dataset_rows(examples, question_label=task.question_label, answer_space=task.answer_space,
                                          search=search)
        stats["messages"] = {"rows": len(messages), "left_out": dict(left_out)}
        files = {
            "train.jsonl": "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples),
            MESSAGES_FILE: "".join(json.dumps(m, ensure_ascii=False) + "\n" for m in messages),
            FAILED_FILE: failed_lines(selection),
            "stats.json": json.dumps(stats, indent=2) + "\n",
            "README.md": format_card(stats, cfg, task),
        }
        write_dataset_dir(folder, files, dataset_manifest(cfg, task, method, inputs, stats, reports, equal))
        print(stats_line(stats))
        results[method] = stats
    if not results and not allow_empty:
        raise PipelineError(f"filter: no method kept any episode ({', '.join(empty)}); check the inputs' em/finished fields")
    write_manifest(out_dir / "manifest.json", stage="filter", config=to_dict(cfg), complete=True,
                   task=task.name, inputs=inputs, formats=sorted(results), empty_formats=empty,
                   counts={m: {"seen": s["seen"], "kept": s["kept"]} for m, s in results.items()},
                   **({"equal_rows": {"rows": equal["rows"], "smallest": equal["smallest"]}} if equal else {}))
    written = ", ".join(f"{m} {s['kept']}" for m, s in results.items())
    print(f"datasets in {out_dir}/<method>/train.jsonl: {written}")
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, FilterConfig)
    parser.add_argument("--from-fireact", action="append", default=[], metavar="PATH",
                        help="add a FireAct alpaca .json / gpt .jsonl file or folder as input (repeatable)")
    parser.add_argument("--force", action="store_true", help="rebuild datasets even when up to date")


def main(args: argparse.Namespace) -> int:
    cfg = stage_config(FilterConfig, args, section="filter")
    cfg.fireact = [*cfg.fireact, *args.from_fireact]
    cfg.force = cfg.force or args.force
    run_filter(cfg)
    return 0
