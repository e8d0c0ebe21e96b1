"""`generate`: a prompted teacher answers questions with each method -> one JSONL per method.

    python -m pipeline generate --config configs/demo.yaml                 # the demo's section
    python -m pipeline generate teacher.backend=oracle methods=[react,act] limit=20 out_dir=runs/gen/x
    python -m pipeline generate teacher.model=smollm2 questions=offline-bootstrap limit=8
    python -m pipeline generate --config configs/fever.yaml        # FEVER claims (task: fever)

One record per finished episode is appended (flushed, fsynced) as it finishes; a re-run skips the
question ids already written, so a killed run resumes where it stopped.

Target mode (`target_correct=N`, as the paper keeps 3,000 correct trajectories per method): the
question pool (the set, cut to `limit` if given) is shuffled with `order_seed`, and each method
draws questions in that order, a batch at a time, until it has N correct (finished, and correct
by the task's metric: HotpotQA EM 1, FEVER the gold label) episodes or the pool is exhausted; it reports how many questions it needed. A re-run recomputes
everything from the records, so it resumes too (and a larger N continues where a smaller stopped). `teacher.backend=oracle`
is a stand-in teacher that writes correct trajectories from HotpotQA's gold supporting facts
(NOT the paper's PaLM-540B; FEVER's replays ReAct's released trajectories, pipeline.tasks.fever);
any transformers / vllm / openai model is a real teacher.
`teacher.oracle_style=agent` makes the oracle search names as the question writes them, miss and
recover (`exact`, the default, searches the gold titles). The stats (manifest, summary lines) say
how often Act / ReAct episodes missed a search, recovered, and used Lookup.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pipeline.agent.answerers import answerer
from pipeline.agent.episodes import MAX_ERROR_SHARE, method_stats, run_methods, set_aside_errors
from pipeline.agent.run_folder import start_run, writing_run
from pipeline.core.config import add_config_arguments, stage_config, to_dict
from pipeline.core.errors import PipelineError
from pipeline.core.same_run import run_keys, same_run
from pipeline.core.storage import check_writable_dir, write_manifest
from pipeline.llm.config import LLMConfig
from pipeline.methods import MethodSettings
from pipeline.tasks import Task, get_task
from pipeline.wiki.config import WikiConfig


@dataclass
class GenerateConfig:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"method": "prompting"}  # old key -> new (pipeline.core.config)

    task: str = same_run("identity", shard_set=True, default="hotpotqa")  # hotpotqa | fever (pipeline.tasks): the questions, metric and exemplars
    teacher: LLMConfig = same_run("identity", shard_set=True, default_factory=LLMConfig)  # backend: transformers|vllm|openai|oracle
    methods: list[str] = same_run("free", default_factory=lambda: ["standard", "cot", "act", "react"])
    questions: str = same_run("identity", shard_set=True, default="offline-bootstrap")  # a question-set name of the task (pipeline.tasks) or a file
    limit: int | None = same_run("free", shard_set=True, default=None)  # the first N questions of the set
    out_dir: Path = same_run("free", default=Path("runs/generate/default"))
    prompting: MethodSettings = same_run("identity", shard_set=True, default_factory=MethodSettings)  # how the teacher is prompted
    wiki: WikiConfig = same_run("identity", shard_set=True, default_factory=WikiConfig)
    max_in_flight: int = same_run("free", default=16)  # episodes run at once (in rounds, or continuously against a server: pipeline.agent.scheduler)
    target_correct: int | None = same_run("free", default=None)  # target mode: draw questions until each method has N correct
    order_seed: int = same_run("target", default=0)  # target mode: the seed of the order in which questions are drawn
    shard: str | None = same_run("identity", default=None)  # i/n: this job's share of the questions, for N jobs (pipeline.core.shards)
    # Stop, the run left incomplete, once more than this share of a method's episodes (of a target
    # mode batch) end in a model or page-source error; a re-run runs those episodes again
    max_error_share: float = same_run("free", default=MAX_ERROR_SHARE)


# Keys whose change makes old records incomparable with new ones (a larger `limit` is fine):
# declared on the fields (pipeline.core.same_run).
IDENTITY_KEYS = run_keys(GenerateConfig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, GenerateConfig)


def main(args: argparse.Namespace) -> int:
    generate(stage_config(GenerateConfig, args, section="generate"))
    return 0


def generate(cfg: GenerateConfig) -> dict[str, dict]:
    """Run every method; return per-method stats. Validates everything before writing."""
    check_writable_dir(cfg.out_dir)  # before any model is loaded or episode run
    task = get_task(cfg.task)
    teacher = answerer(cfg.teacher, task)
    keys = IDENTITY_KEYS if cfg.target_correct is None else (*IDENTITY_KEYS, *run_keys(GenerateConfig, "target"))
    questions, backend, llm, exemplar_sources = start_run(cfg, "generate", teacher, cfg.prompting, keys)
    manifest = dict(stage="generate", config=to_dict(cfg), task=task.name, teacher=teacher.label,
                    exemplar_sources=exemplar_sources, n_questions=len(questions))
    with writing_run(cfg, keys, manifest) as manifest_path:
        if cfg.target_correct is None:
            stats = run_methods(teacher, llm, cfg.methods, questions, cfg.prompting, backend, cfg.out_dir,
                                max_in_flight=cfg.max_in_flight, source="generate",
                                max_error_share=cfg.max_error_share)
        else:
            stats = run_to_target(teacher, llm, cfg, questions, backend)
        add_search_stats(stats, cfg.out_dir, questions, task)
        write_manifest(manifest_path, complete=True, stats=stats, **manifest)
    for name, s in stats.items():
        print(f"{name:>16}: {s['n']} episodes, {task.metric_label} {s['em']:.3f}, F1 {s['f1']:.3f}, "
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


def is_correct(record: dict, task: Task | None = None) -> bool:
    """What target mode counts: a finished episode, correct by the task's rule (pipeline.tasks)."""
    return bool(record.get("finished")) and get_task(task).is_correct(record)


def target_progress(order: list, records: dict[str, dict], target: int, task: Task | None = None) -> dict:
    """Correct episodes so far and, once there are `target`, how many questions of the order
    it took to reach them (counting in draw order, so it does not depend on which episode of a
    batch happened to finish first)."""
    correct, needed = 0, None
    for position, q in enumerate(order, 1):
        record = records.get(str(q.id))
        if record is not None and is_correct(record, task):
            correct += 1
            if correct == target and needed is None:
                needed = position
    return {"target": target, "correct": correct, "reached": correct >= target,
            "questions_needed": needed, "drawn": sum(str(q.id) in records for q in order),
            "pool": len(order)}


def run_to_target(teacher, llm, cfg: GenerateConfig, questions: list, backend) -> dict[str, dict]:
    """Target mode (module docstring): per method, draw batches in the seeded order until the
    method has `target_correct` correct episodes or no question is left. A shard i/n (its share
    of the pool, pipeline.core.shards) aims at ceil(target_correct / n): the merged shards hold at
    least target_correct, and filter's max_per_method keeps a seeded draw of that many."""
    from pipeline.core.shards import parse_shard
    from pipeline.core.storage import read_jsonl

    if cfg.target_correct < 1:
        raise PipelineError(f"target_correct must be >= 1, got {cfg.target_correct}")
    shard = parse_shard(cfg.shard)
    target = cfg.target_correct if shard is None else -(-cfg.target_correct // shard.count)
    order = draw_order(questions, cfg.order_seed)
    pool_ids = {str(q.id) for q in order}
    stats = {}
    for name in cfg.methods:
        path = cfg.out_dir / f"{name}.jsonl"
        # Episodes that ended in a backend error in an earlier run are drawn again, in their place
        # in the order; within this run an errored episode stays drawn (no retry loop).
        set_aside_errors(path)
        while True:
            records = {str(r["id"]): r for r in (read_jsonl(path) if path.exists() else [])
                       if str(r["id"]) in pool_ids}
            progress = target_progress(order, records, target, teacher.task)
            todo = [q for q in order if str(q.id) not in records]
            if progress["reached"] or not todo:
                break
            # enough for the missing ones at a perfect rate, and at least a full round of the runner
            batch = todo[:max(target - progress["correct"], cfg.max_in_flight)]
            run_methods(teacher, llm, [name], batch, cfg.prompting, backend, cfg.out_dir,
                        max_in_flight=cfg.max_in_flight, source="generate", max_error_share=cfg.max_error_share,
                        retry_errors=False)
        stats[name] = {**method_stats(path, set(records)), "target": progress}
    return stats


def add_search_stats(stats: dict[str, dict], out_dir: Path, questions: list, task: Task | None = None) -> None:
    """For Act / ReAct files: how the episodes searched (pipeline.agent.search_stats), over all of them
    (`search`) and over the correct ones the filter keeps for training (`search_correct`)."""
    from pipeline.agent.search_stats import search_stats
    from pipeline.core.storage import read_jsonl

    ids = {str(q.id) for q in questions}
    for name, s in stats.items():
        path = out_dir / f"{name}.jsonl"
        records = [r for r in read_jsonl(path) if str(r["id"]) in ids and r.get("steps")] if path.exists() else []
        if records:
            s["search"] = search_stats(records)
            s["search_correct"] = search_stats(r for r in records if get_task(task).is_correct(r))


def search_line(s: dict) -> str:
    def pct(rate):
        return "-" if rate is None else f"{rate:.0%}"

    return (f"correct episodes: {s['episodes']}; missed a search {s['miss_episodes']} ({pct(s['miss_rate'])}), "
            f"recovered {s['recovered_episodes']} ({pct(s['recover_rate'])} of those), "
            f"looked up {s['lookup_episodes']} ({pct(s['lookup_rate'])}); search hit rate {pct(s['search_hit_rate'])}")
