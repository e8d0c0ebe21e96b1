"""Self-training rounds: the student as its own teacher (STaR, Zelikman et al. 2022; the paper
bootstraps once). A grid's `self_training:` section (`run`, pipeline/stages/run.py):

    self_training:
      rounds: 3          # round 1 is the grid itself; rounds 2 and 3 follow
      formats: [react]   # the formats that self-train (default: the grid's formats)
      limit: 200         # bootstrap questions each round's teacher answers (the same ones every round)
      samples: 4         # episodes per question, sampled at `temperature`: rejection sampling
      temperature: 0.7
      init: base         # base: each round's student trains from the base model (STaR) | previous
      data: union        # union: round k-1's training rows plus round k's new correct ones | new

Round 1 is the grid's own units: the configured teacher generates, filter keeps the correct
trajectories, each student trains on them and is evaluated. Round k (k >= 2) of a student and a
format is four units of the `rounds` phase, in this order:

  generate  round k-1's student (its final/) answers the bootstrap questions in its format,
            zero-shot and sampled, decoding as its eval does (its `model` and `prompting`
            sections; through the same shared vLLM server when its eval has `serve:`, else
            in-process, in a child process); `earlier_runs` names every earlier round's
            generate folder, so the manifest counts the questions solved for the first time
  filter    the correct trajectories of round k (distinct ones, every sample), its failed ones
            in failed.jsonl with why; `data: union` starts the dataset from round k-1's rows
  train     from the base model (`init: base`) or from round k-1's final/ (`init: previous`,
            full fine-tuning only), into a sibling of round 1's folder: <format>-round<k>/
  eval      as round 1's student is evaluated (the grid's `eval` section)

Folders: <out_dir>/rounds/<student>-<format>/round-<k>/{generate,sft}/ and
<out_dir>/eval/<student>-ft-<format>-round<k>/. Every unit skips when done and resumes when
interrupted, as every unit of a grid. `plot` adds the rounds table and figure (EM by round, with
Wilson intervals: pipeline/report/rounds.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pipeline.core.config import at_least, checked, distinct, in_range, merged
from pipeline.core.errors import PipelineError


@dataclass
class SelfTrainingConfig:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"methods": "formats"}  # old key -> new (pipeline.core.config)

    rounds: int = at_least(1, default=1)  # rounds in all; 1 = no self-training (round 1 is the grid's own teacher and students)
    formats: list[str] = checked(distinct, default_factory=list)  # the formats that self-train; empty: every format of the grid
    students: list[str] = checked(distinct, default_factory=list)  # by name; empty: every student trained here
    questions: str | None = None  # the bootstrap set each round's teacher answers; null: the generate section's
    limit: int | None = at_least(1, default=None)  # its first N questions, the same every round (null: all of them)
    samples: int = at_least(1, default=4)  # episodes per question (rejection sampling: the correct ones are kept)
    temperature: float = checked(in_range(0), default=0.7)  # sampling temperature of the rounds' teachers
    init: Literal["base", "previous"] = "base"  # base: from the base model each round (STaR); previous: continue round k-1's
    data: Literal["union", "new"] = "union"  # union: round k-1's training rows + round k's new; new: round k's only
    generate: dict = field(default_factory=dict)  # GenerateConfig keys for the rounds' generate units
    filter: dict = field(default_factory=dict)  # FilterConfig keys for the rounds' filter units (e.g. max_per_method)
    train: dict = field(default_factory=dict)  # FinetuneConfig keys for the rounds' training (e.g. max_steps)


@dataclass
class Round:
    """Where one round of one student and format reads and writes."""

    number: int
    student: str
    format: str
    generate_dir: Path  # its teacher's trajectories: <generate_dir>/<format>.jsonl
    dataset_dir: Path  # its student's SFT dataset: <dataset_dir>/<format>/train.jsonl
    final: Path  # its student's final/
    eval_dir: Path  # its student's eval

    @property
    def teacher_label(self) -> str:
        """The name the next round's teacher (this round's student) goes by in records and manifests."""
        return f"{self.student} round {self.number} ({self.format})"


def check(st: SelfTrainingConfig) -> None:
    if st.rounds < 1:
        raise PipelineError(f"self_training.rounds must be >= 1 (rounds in all, round 1 the grid's own), got {st.rounds}")
    if st.samples < 1 or st.temperature < 0:
        raise PipelineError(f"self_training: samples must be >= 1 and temperature >= 0 (got {st.samples}, {st.temperature})")
    if st.samples > 1 and st.temperature == 0:
        raise PipelineError(f"self_training.samples={st.samples} at temperature 0 would draw {st.samples} identical "
                            "episodes per question; set self_training.temperature (e.g. 0.7) or samples: 1")
    if st.limit is not None and st.limit < 1:
        raise PipelineError(f"self_training.limit must be >= 1 (bootstrap questions per round), got {st.limit}")


def lines(st: SelfTrainingConfig, trained: list[str], formats: list[str]) -> list[tuple[str, str]]:
    """(student name, format) of every lineage that self-trains; [] without rounds."""
    check(st)
    if st.rounds == 1:
        return []
    unknown = [m for m in st.formats if m not in formats]
    strangers = [s for s in st.students if s not in trained]
    if unknown or strangers:
        what = (f"formats {unknown} are not among the grid's formats {formats}" if unknown
                else f"students {strangers} are not students trained here ({', '.join(trained) or 'none'})")
        raise PipelineError(f"self_training: {what}; a round's teacher is a student trained in round 1")
    chosen = [s for s in trained if not st.students or s in st.students]
    if not chosen:
        raise PipelineError("self_training: no student is trained here; a round's teacher is round 1's student")
    return [(s, m) for s in chosen for m in (st.formats or formats)]


def next_round(out_dir: Path, previous: Round) -> Round:
    """The folders of the round after `previous`; its checkpoint beside round 1's (<format>-round<k>)."""
    k = previous.number + 1
    root = out_dir / "rounds" / f"{previous.student}-{previous.format}" / f"round-{k}"
    student_root = previous.final.parent.parent  # <output_root>/<experiment>/<student>/
    return Round(k, previous.student, previous.format, root / "generate", root / "sft",
                 student_root / f"{previous.format}-round{k}" / "final",
                 out_dir / "eval" / f"{previous.student}-ft-{previous.format}-round{k}")


def teacher(eval_model: dict, finetuning: str, base_model: str, previous: Round) -> dict:
    """The LLMConfig keys of round k's teacher: round k-1's student as its eval loads it (the
    eval's model section with the checkpoint in place: the full model, or the base with the adapter)."""
    full = finetuning == "full"
    return {**eval_model, "model": str(previous.final) if full else base_model,
            "adapter": None if full else str(previous.final), "gguf_file": None, "name": previous.teacher_label}


# The eval keys a round's teacher decodes with, as that student's own eval does.
DECODING_KEYS = ("prompting", "max_in_flight", "max_error_share")
# The generate keys the rounds set themselves (the grid's generate section is round 1's teacher's:
# the stand-in teacher's `oracle` too, while a later round's teacher is a student).
ROUND_OWN_KEYS = ("teacher", "oracle", "methods", "questions", "limit", "target_correct", "order_seed", "shard", "samples",
                  "earlier_runs", "serve", "out_dir")


def generate_layer(st: SelfTrainingConfig, grid_generate: dict, student_eval: dict, teacher_model: dict,
                   serve: dict | None, earlier: list[Round], r: Round) -> dict:
    """Round r's GenerateConfig keys (the task and wiki come first, from the grid)."""
    shared = {k: v for k, v in grid_generate.items() if k not in ROUND_OWN_KEYS}
    decoding = {k: student_eval[k] for k in DECODING_KEYS if k in student_eval}
    questions = st.questions or grid_generate.get("questions")
    return merged(shared, decoding, st.generate, {
        "teacher": teacher_model, "oracle": None, "methods": [r.format], "limit": st.limit, "samples": st.samples,
        "prompting": {"style": "zero_shot", "temperature": st.temperature},  # a fine-tuned student decodes zero-shot
        "earlier_runs": [str(e.generate_dir) for e in earlier], "serve": serve, "out_dir": str(r.generate_dir),
        **({"questions": questions} if questions else {})})


def filter_layer(st: SelfTrainingConfig, grid_filter: dict, previous: Round, r: Round) -> dict:
    return merged(grid_filter, st.filter, {
        "inputs": [str(r.generate_dir)], "formats": [r.format], "out_dir": str(r.dataset_dir),
        "union_with": [str(previous.dataset_dir)] if st.data == "union" else []})


def train_layer(st: SelfTrainingConfig, previous: Round, r: Round) -> dict:
    start = {"student": str(previous.final), "init": "pretrained"} if st.init == "previous" else {}
    return {**st.train, **start, "dataset_dir": str(r.dataset_dir), "output_dir": str(r.final.parent)}


def check_init(st: SelfTrainingConfig, finetuning: str, where: str) -> None:
    if st.init == "previous" and finetuning != "full":
        raise PipelineError(f"{where}: self_training.init: previous continues round k-1's full model; a {finetuning} "
                            "student trains from its base each round (init: base)")


def check_teacher_ready(r: Round, previous: Round) -> None:
    """Round r's teacher must be trained (a run with --only rounds before the train phase)."""
    from pipeline.core.storage import is_done

    if not is_done(previous.final / "manifest.json"):
        raise PipelineError(f"round {r.number} of {r.student} ({r.format}): its teacher, round {previous.number}'s "
                            f"student {previous.final}, is not trained yet; run the phases before `rounds` first")


def check_round_data(stats: dict, r: Round, st: SelfTrainingConfig) -> dict:
    """After round r's filter: something to train on, or one line saying what to change."""
    if r.format in stats:
        return stats
    raise PipelineError(f"round {r.number} of {r.student} ({r.format}): the teacher solved none of the bootstrap "
                        f"questions ({r.dataset_dir / r.format / 'failed.jsonl'} holds its failed episodes), so "
                        "there is nothing new to train on; raise self_training.samples, limit or temperature, "
                        "or set self_training.data: union to train on the earlier rounds' rows")


def report_line(first: Round, later: list[Round], prompted: Path | None) -> dict[str, Any]:
    """What the rounds report reads for one lineage (pipeline/report/rounds.py)."""
    return {"student": first.student, "format": first.format,
            "prompted": str(prompted / "summary.json") if prompted else None,
            "rounds": [{"round": r.number, "generate": str(r.generate_dir), "dataset": str(r.dataset_dir / r.format),
                        "summary": str(r.eval_dir / "summary.json")} for r in [first, *later]]}
