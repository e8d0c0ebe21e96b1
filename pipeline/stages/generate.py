"""`generate`: a prompted teacher answers questions with each method -> one JSONL per method.

    python -m pipeline generate --config configs/demo.yaml                 # the demo's section
    python -m pipeline generate teacher.backend=oracle methods=[react,act] limit=20 out_dir=runs/gen/x
    python -m pipeline generate teacher.model=smollm2 questions=offline-bootstrap limit=8

One record per finished episode is appended (flushed, fsynced) as it finishes; a re-run skips the
question ids already written, so a killed run resumes where it stopped.

Target mode (`target_correct=N`, as the paper keeps 3,000 correct trajectories per method): the
question pool (the set, cut to `limit` if given) is shuffled with `order_seed`, and each method
draws questions in that order, a batch at a time, until it has N correct (finished, EM 1)
episodes or the pool is exhausted; it reports how many questions it needed. A re-run recomputes
everything from the records, so it resumes too (and a larger N continues where a smaller stopped). `teacher.backend=oracle`
is a stand-in teacher that writes correct trajectories from HotpotQA's gold supporting facts
(NOT the paper's PaLM-540B); any transformers / vllm / openai model is a real teacher.
`teacher.oracle_style=agent` makes the oracle search names as the question writes them, miss and
recover (`exact`, the default, searches the gold titles). The stats (manifest, summary lines) say
how often Act / ReAct episodes missed a search, recovered, and used Lookup.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config import add_config_arguments, load_config, to_dict
from pipeline.errors import PipelineError
from pipeline.llm.config import LLMConfig
from pipeline.methods import MethodSettings
from pipeline.storage import check_writable_dir, read_manifest, write_manifest
from pipeline.wiki.config import WikiConfig


@dataclass
class GenerateConfig:
    teacher: LLMConfig = field(default_factory=LLMConfig)  # backend: transformers|vllm|openai|oracle
    methods: list[str] = field(default_factory=lambda: ["standard", "cot", "act", "react"])
    questions: str = "offline-bootstrap"  # a question-set name (pipeline.hotpotqa) or a file
    limit: int | None = None  # the first N questions of the set
    out_dir: Path = Path("runs/generate/default")
    method: MethodSettings = field(default_factory=MethodSettings)
    wiki: WikiConfig = field(default_factory=WikiConfig)
    max_in_flight: int = 16  # episodes run at once (one batched LLM call per round)
    target_correct: int | None = None  # target mode: draw questions until each method has N correct
    order_seed: int = 0  # target mode: the seed of the order in which questions are drawn


# Keys whose change makes old records incomparable with new ones (a larger `limit` is fine).
IDENTITY_KEYS = ("teacher", "questions", "method", "wiki")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)


def main(args: argparse.Namespace) -> int:
    cfg = load_config(GenerateConfig, args.config, args.overrides, section="generate")
    generate(cfg)
    return 0


def generate(cfg: GenerateConfig) -> dict[str, dict]:
    """Run every method; return per-method stats. Validates everything before writing."""
    from pipeline.episodes import run_lock, run_methods
    from pipeline.hotpotqa import load_question_set
    from pipeline.wiki.config import open_backend

    check_writable_dir(cfg.out_dir)  # before any model is loaded or episode run
    label = teacher_label(cfg.teacher)
    check_oracle_style(cfg.teacher, label)
    exemplar_sources = check_methods(cfg.methods, cfg.method, label)
    questions = load_question_set(cfg.questions, limit=cfg.limit)
    if not questions:
        raise PipelineError(f"question set '{cfg.questions}' is empty")
    keys = IDENTITY_KEYS if cfg.target_correct is None else (*IDENTITY_KEYS, "order_seed")
    check_resumable(cfg.out_dir, "generate", to_dict(cfg), keys)
    backend = open_backend(cfg.wiki)
    llm = None if label == "oracle" else open_llm(cfg.teacher)
    manifest = dict(stage="generate", config=to_dict(cfg), teacher=label,
                    exemplar_sources=exemplar_sources, n_questions=len(questions))
    manifest_path = cfg.out_dir / "manifest.json"
    with run_lock(cfg.out_dir):
        check_resumable(cfg.out_dir, "generate", to_dict(cfg), keys)  # again, now that we hold the folder
        write_manifest(manifest_path, complete=False, **manifest)
        if cfg.target_correct is None:
            stats = run_methods(llm, label, cfg.methods, questions, cfg.method, backend, cfg.out_dir,
                                max_in_flight=cfg.max_in_flight, source="generate",
                                oracle_style=cfg.teacher.oracle_style)
        else:
            stats = run_to_target(llm, label, cfg, questions, backend)
        add_search_stats(stats, cfg.out_dir, questions)
        write_manifest(manifest_path, complete=True, stats=stats, **manifest)
    for name, s in stats.items():
        print(f"{name:>16}: {s['n']} episodes, EM {s['em']:.3f}, F1 {s['f1']:.3f}, "
              f"finished {s['finish_rate']:.0%} -> {cfg.out_dir / (name + '.jsonl')}")
        if "target" in s:
            t = s["target"]
            reached = (f"reached after {t['questions_needed']} questions" if t["reached"]
                       else f"NOT reached: the pool of {t['pool']} is exhausted")
            print(f"{'':>16}  target {t['target']} correct: {t['correct']} correct, {reached}")
        if "search" in s:
            print(" " * 18 + search_line(s["search_correct"]))
    return stats


def draw_order(questions: list, seed: int) -> list:
    """The seeded order in which target mode draws questions (independent of the set's order
    of appearance only through the seed: the same pool and seed give the same order)."""
    import random

    order = list(questions)
    random.Random(seed).shuffle(order)
    return order


def is_correct(record: dict) -> bool:
    return bool(record.get("finished")) and float(record.get("em") or 0.0) == 1.0


def target_progress(order: list, records: dict[str, dict], target: int) -> dict:
    """Correct episodes so far and, once there are `target`, how many questions of the order
    it took to reach them (counting in draw order, so it does not depend on which episode of a
    batch happened to finish first)."""
    correct, needed = 0, None
    for position, q in enumerate(order, 1):
        record = records.get(str(q.id))
        if record is not None and is_correct(record):
            correct += 1
            if correct == target and needed is None:
                needed = position
    return {"target": target, "correct": correct, "reached": correct >= target,
            "questions_needed": needed, "drawn": sum(str(q.id) in records for q in order),
            "pool": len(order)}


def run_to_target(llm, label: str, cfg: GenerateConfig, questions: list, backend) -> dict[str, dict]:
    """Target mode (module docstring): per method, draw batches in the seeded order until the
    method has `target_correct` correct episodes or no question is left."""
    from pipeline.episodes import method_stats, run_methods
    from pipeline.storage import read_jsonl

    if cfg.target_correct < 1:
        raise PipelineError(f"target_correct must be >= 1, got {cfg.target_correct}")
    order = draw_order(questions, cfg.order_seed)
    pool_ids = {str(q.id) for q in order}
    stats = {}
    for name in cfg.methods:
        path = cfg.out_dir / f"{name}.jsonl"
        while True:
            records = {str(r["id"]): r for r in (read_jsonl(path) if path.exists() else [])
                       if str(r["id"]) in pool_ids}
            progress = target_progress(order, records, cfg.target_correct)
            todo = [q for q in order if str(q.id) not in records]
            if progress["reached"] or not todo:
                break
            # enough for the missing ones at a perfect rate, and at least a full round of the runner
            batch = todo[:max(cfg.target_correct - progress["correct"], cfg.max_in_flight)]
            run_methods(llm, label, [name], batch, cfg.method, backend, cfg.out_dir,
                        max_in_flight=cfg.max_in_flight, source="generate",
                        oracle_style=cfg.teacher.oracle_style)
        stats[name] = {**method_stats(path, set(records)), "target": progress}
    return stats


def check_oracle_style(teacher: LLMConfig, label: str) -> None:
    """teacher.oracle_style means something only to the oracle: fail rather than ignore it."""
    from pipeline.methods.oracle import DEFAULT_STYLE, check_style

    if label == "oracle":
        check_style(teacher.oracle_style)
    elif teacher.oracle_style != DEFAULT_STYLE:
        raise PipelineError(f"teacher.oracle_style={teacher.oracle_style} applies only to teacher.backend=oracle "
                            f"(the stand-in teacher); remove it for the {teacher.backend} teacher")


def add_search_stats(stats: dict[str, dict], out_dir: Path, questions: list) -> None:
    """For Act / ReAct files: how the episodes searched (pipeline.search_stats), over all of them
    (`search`) and over the correct ones the filter keeps for training (`search_correct`)."""
    from pipeline.search_stats import search_stats
    from pipeline.storage import read_jsonl

    ids = {str(q.id) for q in questions}
    for name, s in stats.items():
        path = out_dir / f"{name}.jsonl"
        records = [r for r in read_jsonl(path) if str(r["id"]) in ids and r.get("steps")] if path.exists() else []
        if records:
            s["search"] = search_stats(records)
            s["search_correct"] = search_stats(r for r in records if float(r.get("em") or 0) == 1.0)


def search_line(s: dict) -> str:
    def pct(rate):
        return "-" if rate is None else f"{rate:.0%}"

    return (f"correct episodes: {s['episodes']}; missed a search {s['miss_episodes']} ({pct(s['miss_rate'])}), "
            f"recovered {s['recovered_episodes']} ({pct(s['recover_rate'])} of those), "
            f"looked up {s['lookup_episodes']} ({pct(s['lookup_rate'])}); search hit rate {pct(s['search_hit_rate'])}")


def teacher_label(teacher: LLMConfig) -> str:
    return "oracle" if teacher.backend == "oracle" else teacher.label


def check_methods(methods: list[str], settings: MethodSettings, label: str) -> dict[str, dict]:
    """Fail fast on an unknown method or a missing exemplar file; return exemplar sources."""
    from pipeline.methods import prompt_prefixes
    from pipeline.trajectory import METHODS

    if not methods:
        raise PipelineError("methods is empty; name at least one, e.g. methods=[react]")
    if label == "oracle":
        bad = [m for m in methods if m not in METHODS]
        if bad:
            raise PipelineError(f"the oracle teacher writes {', '.join(METHODS)} trajectories, not {', '.join(bad)}")
        return {m: {"source": "oracle (gold supporting facts)"} for m in methods}
    return {m: {fmt: p.source for fmt, p in prompt_prefixes(m, settings).items()} for m in methods}


def open_llm(cfg: LLMConfig):
    from pipeline.llm.factory import load_llm

    llm = load_llm(cfg)
    check = getattr(llm, "check_available", None)
    if check is not None:
        check()
    return llm


# Operational knobs that do not change what a teacher writes.
OPERATIONAL_KEYS = ("max_batch_size", "max_concurrency", "timeout_s", "max_retries", "device")


def identity(config: dict, keys: tuple[str, ...] = IDENTITY_KEYS) -> dict:
    config = {k: config.get(k) for k in keys}
    for k in ("teacher", "model"):  # the LLM sections: how it is served does not matter
        if isinstance(config.get(k), dict):
            config[k] = {key: v for key, v in config[k].items() if key not in OPERATIONAL_KEYS}
    return config


def check_resumable(out_dir: Path, stage: str, config: dict, keys: tuple[str, ...] = IDENTITY_KEYS) -> None:
    """Refuse to append to a folder written by another stage or with a different model,
    question set or method settings (`keys` of the stage config): records would get mixed."""
    old = read_manifest(out_dir / "manifest.json")
    if old is None:
        return
    new, was = identity(config, keys), identity(old.get("config", {}), keys)
    changed = [k for k in keys if was.get(k) != new.get(k)]
    if old.get("stage") != stage or changed:
        raise PipelineError(
            f"{out_dir} holds a {old.get('stage')} run with a different {', '.join(changed) or 'stage'}; "
            "use another out_dir (or delete that folder) to start afresh"
        )
