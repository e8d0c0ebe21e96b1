"""What a grid's YAML says: the experiment (RunConfig), its students and its optional `grpo` phase."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from pipeline.core.config import at_least, checked, distinct, folder_name, in_range, listed
from pipeline.report.summaries import ORACLE_DATA_SUFFIX
from pipeline.rounds import SelfTrainingConfig


@dataclass
class Student:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"checkpoint": "finetuned"}  # old key -> new (pipeline.core.config)

    name: str = checked(folder_name)  # folder label, e.g. smollm2-135m
    config: Path | None = None  # its FinetuneConfig YAML (configs/students/...); not with `finetuned`
    size_class: str | None = None  # 135m | 8b | 62b ...; a known released agent has its own
    params_b: float | None = checked(in_range(0, above=True), default=None)  # billions of parameters: the figure's x axis
    prompt_model: dict = field(default_factory=dict)  # LLMConfig keys to prompt the base model; {} = skip
    finetune: bool = True  # train it on each method and evaluate zero-shot
    train: dict = field(default_factory=dict)  # FinetuneConfig overrides for this student
    # Already fine-tuned (a folder or hub id, e.g. forestai/fireact_llama_2_7b_lora): evaluated
    # and plotted beside ours, never trained; `format` says how it decodes when it is not known.
    finetuned: str | None = None  # eval's `finetuned=` for it
    format: str | None = None
    # EvalConfig keys for this student's evaluations, over the experiment's `eval` section: e.g. a
    # 70B student's model.tensor_parallel_size, model.gpu_memory_utilization, model.max_context,
    # model.backend, or a `serve:` section (pipeline/llm/serving.py)
    eval: dict = field(default_factory=dict)


@dataclass
class GrpoPhase:
    """The grid's optional `grpo` section: GRPO (pipeline/stages/grpo.py) of each trained student's
    fine-tuned `final/` of these formats, then an eval of each result (docs/grpo.md)."""

    formats: list[str] = checked(distinct, default_factory=list)  # react and/or act; [] (the default): no grpo phase
    config: Path | None = None  # a GrpoConfig YAML to start from (its `grpo` section or the whole file)
    students: list[str] | None = checked(distinct, default=None)  # the student names to run it for; None: every student trained here
    settings: dict = field(default_factory=dict)  # GrpoConfig keys over `config` (e.g. max_steps, group_size)
    # Whose student GRPO continues: 1, the grid's fine-tuned students (the `grpo` phase, before the
    # evals); N > 1, self-training round N's (after that round, in the `rounds` phase): the chain
    # round 1 -> rounds -> GRPO of the last round's student in one command (configs/small-chain.yaml)
    from_round: int = at_least(1, default=1)


@dataclass
class TargetNode:
    """The GPU node the grid is written for. `run --rehearse` simulates it (pipeline/rehearsal/node.py:
    its stand-in nvidia-smi, its launches' process counts); the real run uses the GPUs it finds."""
    gpus: int = at_least(1, default=8)
    gpu_mib: int = at_least(1, default=81559)  # each GPU's memory.total: 81559 an H100 80GB, 40960 an A100 40GB


@dataclass
class RunConfig:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"methods": "formats"}  # old key -> new (pipeline.core.config)

    experiment: str = checked(folder_name, default="default")  # a folder under each student's output_root
    out_dir: Path = Path("runs/default")
    task: str = "hotpotqa"  # hotpotqa | fever (pipeline.tasks), for generate and every eval
    # The grid's trajectory formats: the teacher generates each (prompted with the method of the same
    # name), filter makes its SFT dataset, each student trains on it, and prompted students are evaluated with it
    formats: list[str] = checked(listed, default_factory=lambda: ["standard", "cot", "act", "react"])
    # Methods beside `formats` the prompted students are evaluated with, none trained on (e.g.
    # [rag], the field's retrieval baseline, in wiki.search=bm25)
    prompted_methods: list[str] = checked(distinct, default_factory=list)
    wiki: dict = field(default_factory=dict)  # WikiConfig keys shared by generate and eval
    generate: dict = field(default_factory=dict)  # GenerateConfig keys
    filter: dict = field(default_factory=dict)  # FilterConfig keys
    train: dict = field(default_factory=dict)  # FinetuneConfig keys shared by every student
    eval: dict = field(default_factory=dict)  # EvalConfig keys shared by every evaluation
    plot: dict = field(default_factory=dict)  # PlotConfig keys
    # Student entries: name, config, size_class, params_b, prompt_model, finetune, train, finetuned,
    # format, and eval (this student's EvalConfig keys, e.g. model.tensor_parallel_size or serve)
    students: list[dict] = field(default_factory=list)
    grpo: GrpoPhase = field(default_factory=GrpoPhase)  # GRPO of the trained students; off unless `formats` names one
    # Self-training rounds after round 1 (the grid): each round's student is the next round's
    # teacher (pipeline/rounds.py)
    self_training: SelfTrainingConfig = field(default_factory=SelfTrainingConfig)
    # true: the questions a student trains on (generate's, the rounds', GRPO's) may be among those
    # its fine-tuned evals score (pipeline/tasks/overlap.py); refused otherwise
    allow_question_overlap: bool = False
    # other exemplar sets (ours | paper) the prompted students are also evaluated with, each in its
    # own folder (<student>-prompt-<set>); figure 3 keeps `eval.prompting.exemplars`' cells and
    # plot sets these beside them in exemplars.md
    compare_exemplars: list[str] = checked(distinct, default_factory=list)
    # The stand-in teacher (its style: agent | exact) beside a prompted model teacher: it answers the
    # same questions in the same wiki settings (generate-oracle/), filter keeps per format its
    # trajectories of the questions the model teacher's rows answer, at most as many rows
    # (sft-oracle/: filter's match_dataset), and every trained student trains and is evaluated on
    # them too, as `<student>-oracle-data`; plot sets each such cell beside the student's own in
    # teachers.md. null (the default): no comparison
    compare_oracle: str | None = None
    node: TargetNode = field(default_factory=TargetNode)  # what --rehearse simulates

    def oracle_data_name(self, student: str) -> str:
        """The name (folders, labels) of a student trained on the stand-in's data (compare_oracle)."""
        return f"{student}{ORACLE_DATA_SUFFIX}"
