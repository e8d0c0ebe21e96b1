"""`generate`: a prompted teacher answers questions with each method -> one JSONL per method.

    python -m pipeline generate --config configs/demo.yaml                 # the demo's section
    python -m pipeline generate oracle=exact methods=[react,act] limit=20 out_dir=runs/gen/x
    python -m pipeline generate teacher.model=smollm2 questions=offline-bootstrap limit=8
    python -m pipeline generate --config configs/fever.yaml        # FEVER claims (task: fever)

One record per finished episode is appended (flushed, fsynced) as it finishes; a re-run skips the
question ids already written, so a killed run resumes where it stopped.

Target mode (`target_correct=N`, as the paper keeps 3,000 correct trajectories per method): the
question pool (the set, cut to `limit` if given) is shuffled with `order_seed`, and each method
draws questions in that order, a batch at a time, until it has N correct (finished, and correct
by the task's metric: HotpotQA EM 1, FEVER the gold label) episodes or the pool is exhausted; it reports how many questions it needed. A re-run recomputes
everything from the records, so it resumes too (and a larger N continues where a smaller stopped). `oracle=exact`
answers with a stand-in teacher, no model loaded: it writes correct trajectories from HotpotQA's gold
supporting facts (NOT the paper's PaLM-540B; FEVER's replays ReAct's released trajectories,
pipeline.tasks.fever); with `oracle` unset (null) the `teacher` section's transformers / vllm /
openai model is a real teacher. `oracle=agent` makes the stand-in search names as the question
writes them, miss and recover (`exact` searches the gold titles). The stats (manifest, summary lines) say
how often Act / ReAct episodes missed a search, recovered, and used Lookup.

Rejection sampling (`samples=k prompting.temperature=0.7`): k episodes per question, each a
sample `<question id>#<j>` with its own seeded draws (pipeline.sampling: the same under any batch
and on resume, for a given `prompting.seed`); `filter` keeps the correct ones. The stats say how
many questions at least one episode solved, and with `earlier_runs` (other generate folders, e.g.
the earlier rounds of self-training) how many of those no earlier run had solved.
`serve:` starts `vllm serve` for the teacher (as eval's `serve:` does, pipeline/llm/serving.py).

    python -m pipeline generate teacher.model=checkpoints/x/react/final prompting.style=zero_shot \
        methods=[react] samples=4 prompting.temperature=0.7 limit=50 out_dir=runs/gen/round2
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pipeline.agent.answerers import Answerer, answerer, check_oracle, upgrade_oracle
from pipeline.agent.episodes import MAX_ERROR_SHARE, method_stats, run_methods, set_aside_errors
from pipeline.agent.run_folder import check_settings as check_run_settings
from pipeline.agent.run_folder import sampling_record, start_run, writing_run
from pipeline.core.config import (
    add_config_arguments,
    bound,
    check,
    in_range,
    listed,
    stage_config,
    to_dict,
)
from pipeline.core.errors import PipelineError
from pipeline.core.same_run import run_keys, same_run
from pipeline.core.storage import check_writable_dir, read_jsonl, require_complete, write_manifest
from pipeline.hub.models import require_installed
from pipeline.llm.config import LLMConfig
from pipeline.llm.serving import ServeConfig
from pipeline.methods import MethodSettings
from pipeline.sampling import expand, question_id, solved_questions
from pipeline.tasks import Task, get_task
from pipeline.wiki.config import WikiConfig


@dataclass
class GenerateConfig:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"method": "prompting"}  # old key -> new (pipeline.core.config)
    UPGRADE_OLD: ClassVar = staticmethod(upgrade_oracle)  # an older manifest's `teacher.backend: oracle`

    task: str = same_run("identity", shard_set=True, default="hotpotqa")  # hotpotqa | fever (pipeline.tasks): the questions, metric and exemplars
    teacher: LLMConfig = same_run("identity", shard_set=True, default_factory=LLMConfig)  # backend: transformers|vllm|openai
    # exact | agent: the task's stand-in teacher answers in that search style, no model loaded (the
    # `teacher` section then names no model); null: the teacher model answers (pipeline.agent.answerers)
    oracle: str | None = same_run("identity", shard_set=True, default=None)
    methods: list[str] = same_run("free", metadata=check(listed), default_factory=lambda: ["standard", "cot", "act", "react"])
    questions: str = same_run("identity", shard_set=True, default="offline-bootstrap")  # a question-set name of the task (pipeline.tasks) or a file
    limit: int | None = same_run("free", shard_set=True, default=None, metadata=bound(1))  # the first N questions of the set
    out_dir: Path = same_run("free", default=Path("runs/generate/default"))
    prompting: MethodSettings = same_run("identity", shard_set=True, default_factory=MethodSettings)  # how the teacher is prompted
    wiki: WikiConfig = same_run("identity", shard_set=True, default_factory=WikiConfig)
    max_in_flight: int = same_run("free", default=16, metadata=bound(1))  # episodes run at once (in rounds, or continuously against a server: pipeline.agent.scheduler)
    target_correct: int | None = same_run("free", default=None, metadata=bound(1))  # target mode: draw questions until each method has N correct
    order_seed: int = same_run("target", default=0, metadata=bound(0))  # target mode: the seed of the order in which questions are drawn
    shard: str | None = same_run("identity", default=None)  # i/n: this job's share of the questions, for N jobs (pipeline.core.shards)
    # Stop, the run left incomplete, once more than this share of a method's episodes (of a target
    # mode batch) end in a model or page-source error; a re-run runs those episodes again
    max_error_share: float = same_run("free", default=MAX_ERROR_SHARE, metadata=check(in_range(0, 1)))
    # Episodes per question: k > 1 samples each question k times (records `<id>#<j>`, pipeline.sampling;
    # set prompting.temperature > 0 for a model teacher), for rejection sampling
    samples: int = same_run("identity", shard_set=True, default=1, metadata=bound(1))
    # Generate folders of earlier runs (e.g. earlier self-training rounds): the stats count the
    # questions solved here that none of them solved (the records do not depend on them)
    earlier_runs: list[str] = same_run("free", default_factory=list)
    # Start `vllm serve` for the teacher (its tensor_parallel_size, gpu_memory_utilization, max_context,
    # dtype, extra), generate over HTTP, stop it (pipeline/llm/serving.py; keys as eval's `serve`)
    serve: ServeConfig | None = same_run("free", default=None)


# Keys whose change makes old records incomparable with new ones (a larger `limit` is fine):
# declared on the fields (pipeline.core.same_run).
IDENTITY_KEYS = run_keys(GenerateConfig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, GenerateConfig)


def main(args: argparse.Namespace) -> int:
    generate(stage_config(GenerateConfig, args, section="generate"))
    return 0


def generate(cfg: GenerateConfig) -> dict[str, dict]:
    """Run every method; return per-method stats. Validates everything before writing. The task
    and the teacher are resolved once, here, and handed down (the wiki settings ride the page
    source `start_run` opens: pipeline.wiki.config.open_backend)."""
    check_writable_dir(cfg.out_dir)  # before any model is loaded or episode run
    teacher = check_settings(cfg)
    if cfg.oracle is None:
        require_installed(cfg.teacher.model)  # an embedded model's package, before the wiki index is built
    if cfg.serve is None:
        return run_generation(cfg, teacher)
    from pipeline.agent.run_folder import check_resumable
    from pipeline.llm.serving import ServerGone, for_tool_calls, served

    check_resumable(cfg.out_dir, "generate", cfg, identity_keys(cfg))  # refuse before a server loads for minutes
    serve = for_tool_calls(cfg.serve, cfg.teacher, cfg.prompting.interface)
    with served(cfg.teacher, serve, cfg.out_dir / "serve.log", cfg.max_in_flight) as (llm, server):
        try:
            return run_generation(cfg, answerer(llm, teacher.task, cfg.oracle, cfg.wiki.search), server)
        except ServerGone as gone:
            raise PipelineError(f"generate {cfg.out_dir}: {gone}") from None


def identity_keys(cfg: GenerateConfig) -> tuple[str, ...]:
    return IDENTITY_KEYS if cfg.target_correct is None else (*IDENTITY_KEYS, *run_keys(GenerateConfig, "target"))


def check_settings(cfg: GenerateConfig) -> Answerer:
    """What generate refuses about its own settings, reading and loading nothing (`run` checks
    every generate unit's when it makes its plan); returns who answers, its task resolved."""
    check_samples(cfg)
    check_oracle(cfg.oracle, cfg.serve, cfg.teacher, "teacher")
    teacher = answerer(cfg.teacher, get_task(cfg.task), cfg.oracle, cfg.wiki.search)
    check_run_settings(cfg, teacher, cfg.prompting)
    return teacher


def check_samples(cfg: GenerateConfig) -> None:
    if cfg.samples < 1:
        raise PipelineError(f"samples must be >= 1 (episodes per question), got {cfg.samples}")
    if cfg.samples > 1 and cfg.target_correct is not None:
        raise PipelineError("samples > 1 runs k episodes per question of the set; target_correct draws one per "
                            "question: use one of them (limit= sizes a sampled run)")
    if cfg.samples > 1 and cfg.oracle is None and cfg.prompting.temperature <= 0:
        raise PipelineError(f"samples={cfg.samples} with prompting.temperature=0: greedy decoding writes "
                            f"{cfg.samples} identical episodes per question; set prompting.temperature (e.g. 0.7)")


def run_generation(cfg: GenerateConfig, teacher: Answerer, server=None) -> dict[str, dict]:
    """Generate with `teacher`: the configured one, or the endpoint of a server started for it
    (`server`, watched for dying mid-run)."""
    task = teacher.task
    keys = identity_keys(cfg)
    questions, backend, llm, exemplar_sources = start_run(cfg, "generate", teacher, cfg.prompting, keys)
    earlier = earlier_solved(cfg, task)  # checked before any episode runs
    if server is not None:
        from pipeline.llm.serving import ServedLLM

        llm = ServedLLM(llm, server)
    episodes = expand(questions, cfg.samples)
    manifest = dict(stage="generate", config=to_dict(cfg), task=task.name, search=cfg.wiki.search, teacher=teacher.label,
                    exemplar_sources=exemplar_sources, n_questions=len(questions),
                    sampling=sampling_record(cfg.prompting, llm))
    with writing_run(cfg, keys, manifest) as manifest_path:
        if cfg.target_correct is None:
            stats = run_methods(teacher, llm, cfg.methods, episodes, cfg.prompting, backend, cfg.out_dir,
                                max_in_flight=cfg.max_in_flight, source="generate",
                                max_error_share=cfg.max_error_share)
        else:
            stats = run_to_target(teacher, llm, cfg, questions, backend)
        add_search_stats(stats, cfg.out_dir, episodes, task)
        add_solved_stats(stats, cfg, episodes, earlier, task)
        write_manifest(manifest_path, complete=True, stats=stats, **manifest)
    for name, s in stats.items():
        print(f"{name:>16}: {s['n']} episodes, {task.metric_label} {s['em']:.3f}, F1 {s['f1']:.3f}, "
              f"finished {s['finish_rate']:.0%} -> {cfg.out_dir / (name + '.jsonl')}")
        print(" " * 18 + solved_line(s))
        if "target" in s:
            t = s["target"]
            reached = (f"reached after {t['questions_needed']} questions" if t["reached"]
                       else f"NOT reached: the pool of {t['pool']} is exhausted")
            print(f"{'':>16}  target {t['target']} correct: {t['correct']} correct, {reached}")
        if "search" in s:
            print(" " * 18 + search_line(s["search_correct"]))
    return stats


def earlier_solved(cfg: GenerateConfig, task: Task) -> dict[str, set[str]]:
    """Per method, the questions the `earlier_runs` folders solved (each must be a complete generate run)."""
    solved: dict[str, set[str]] = {name: set() for name in cfg.methods}
    for folder in map(Path, cfg.earlier_runs):
        require_complete(folder / "manifest.json", f"earlier_runs: generate output {folder}")
        for name in cfg.methods:
            path = folder / f"{name}.jsonl"
            if path.exists():
                solved[name] |= solved_questions(read_jsonl(path), task)
    return solved


def add_solved_stats(stats: dict[str, dict], cfg: GenerateConfig, episodes: list, earlier: dict[str, set[str]],
                     task: Task) -> None:
    """Per method: the questions asked (in target mode: drawn), samples per question, the questions at least one episode
    solved and, with earlier_runs, how many of those no earlier run solved."""
    ids = {str(e.id) for e in episodes}
    for name, s in stats.items():
        path = cfg.out_dir / f"{name}.jsonl"
        records = [r for r in read_jsonl(path) if str(r["id"]) in ids] if path.exists() else []
        solved = solved_questions(records, task)
        s.update(questions=len({question_id(r) for r in records}), samples=cfg.samples, solved=len(solved))
        if cfg.earlier_runs:
            s.update(first_solved=len(solved - earlier[name]), earlier_runs=len(cfg.earlier_runs))


def solved_line(s: dict) -> str:
    line = f"solved {s['solved']} of {s['questions']} questions ({s['samples']} episode(s) each)"
    if "first_solved" in s:
        line += f", {s['first_solved']} for the first time (solved in none of {s['earlier_runs']} earlier run(s))"
    return line


def draw_order(questions: list, seed: int) -> list:
    """The seeded order in which target mode draws questions (independent of the set's order
    of appearance only through the seed: the same pool and seed give the same order)."""
    import random

    order = list(questions)
    random.Random(seed).shuffle(order)
    return order


def is_correct(record: dict, task: Task) -> bool:
    """What target mode counts: a finished episode, correct by the task's rule (pipeline.tasks)."""
    return bool(record.get("finished")) and task.is_correct(record)


def target_progress(order: list, records: dict[str, dict], target: int, task: Task) -> dict:
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


def add_search_stats(stats: dict[str, dict], out_dir: Path, questions: list, task: Task) -> None:
    """For Act / ReAct files: how the episodes searched (pipeline.agent.search_stats), over all of them
    (`search`) and over the correct ones the filter keeps for training (`search_correct`)."""
    from pipeline.agent.search_stats import search_stats

    ids = {str(q.id) for q in questions}
    for name, s in stats.items():
        path = out_dir / f"{name}.jsonl"
        records = [r for r in read_jsonl(path) if str(r["id"]) in ids and r.get("steps")] if path.exists() else []
        if records:
            s["search"] = search_stats(records)
            s["search_correct"] = search_stats(r for r in records if task.is_correct(r))


def search_line(s: dict) -> str:
    def pct(rate):
        return "-" if rate is None else f"{rate:.0%}"

    return (f"correct episodes: {s['episodes']}; missed a search {s['miss_episodes']} ({pct(s['miss_rate'])}), "
            f"recovered {s['recovered_episodes']} ({pct(s['recover_rate'])} of those), "
            f"looked up {s['lookup_episodes']} ({pct(s['lookup_rate'])}); search hit rate {pct(s['search_hit_rate'])}")
