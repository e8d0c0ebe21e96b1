"""`generate`: a prompted teacher answers questions with each method -> one JSONL per method.

    python -m pipeline generate --config configs/demo.yaml                 # the demo's section
    python -m pipeline generate teacher.backend=oracle methods=[react,act] limit=20 out_dir=runs/gen/x
    python -m pipeline generate teacher.model=smollm2 questions=offline-bootstrap limit=8

One record per finished episode is appended (flushed, fsynced) as it finishes; a re-run skips the
question ids already written, so a killed run resumes where it stopped. `teacher.backend=oracle`
is a stand-in teacher that writes correct trajectories from HotpotQA's gold supporting facts
(NOT the paper's PaLM-540B); any transformers / vllm / openai model is a real teacher.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from pipeline.config import add_config_arguments, stage_config, to_dict
from pipeline.episodes import answerer, run_methods, start_run, writing_run
from pipeline.llm.config import LLMConfig
from pipeline.methods import MethodSettings
from pipeline.storage import write_manifest
from pipeline.wiki.config import WikiConfig


@dataclass
class GenerateConfig:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"method": "prompting"}  # old key -> new (pipeline.config)

    teacher: LLMConfig = field(default_factory=LLMConfig)  # backend: transformers|vllm|openai|oracle
    methods: list[str] = field(default_factory=lambda: ["standard", "cot", "act", "react"])
    questions: str = "offline-bootstrap"  # a question-set name (pipeline.hotpotqa) or a file
    limit: int | None = None  # the first N questions of the set
    out_dir: Path = Path("runs/generate/default")
    prompting: MethodSettings = field(default_factory=MethodSettings)  # how the teacher is prompted
    wiki: WikiConfig = field(default_factory=WikiConfig)
    max_in_flight: int = 16  # episodes run at once (one batched LLM call per round)


# Keys whose change makes old records incomparable with new ones (a larger `limit` is fine).
IDENTITY_KEYS = ("teacher", "questions", "prompting", "wiki")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, GenerateConfig)


def main(args: argparse.Namespace) -> int:
    generate(stage_config(GenerateConfig, args, section="generate"))
    return 0


def generate(cfg: GenerateConfig) -> dict[str, dict]:
    """Run every method; return per-method stats. Validates everything before writing."""
    teacher = answerer(cfg.teacher)
    questions, backend, llm, exemplar_sources = start_run(cfg, "generate", teacher, cfg.prompting, IDENTITY_KEYS)
    manifest = dict(stage="generate", config=to_dict(cfg), teacher=teacher.label,
                    exemplar_sources=exemplar_sources, n_questions=len(questions))
    with writing_run(cfg, IDENTITY_KEYS, manifest) as manifest_path:
        stats = run_methods(teacher, llm, cfg.methods, questions, cfg.prompting, backend, cfg.out_dir,
                            max_in_flight=cfg.max_in_flight, source="generate")
        write_manifest(manifest_path, complete=True, stats=stats, **manifest)
    for name, s in stats.items():
        print(f"{name:>16}: {s['n']} episodes, EM {s['em']:.3f}, F1 {s['f1']:.3f}, "
              f"finished {s['finish_rate']:.0%} -> {cfg.out_dir / (name + '.jsonl')}")
    return stats
