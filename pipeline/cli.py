"""Command line: `python -m pipeline <stage> [options]` (also installed as `react-pipeline`).

Each stage lives in its own module exposing `add_arguments(parser)` and `main(args) -> int`;
modules are imported only when their stage runs, so `--help` and light stages start fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pipeline.core.errors import one_line_errors  # stdlib only: keeps --help fast
from pipeline.core.progress import use_lines_off_terminal  # stdlib only too

# stage name -> (module, one-line help)
STAGES: dict[str, tuple[str, str]] = {
    "data": ("pipeline.stages.data", "HotpotQA: fetch/locate the data, build the eval sample and offline splits"),
    "wiki": ("pipeline.stages.wiki", "local Wikipedia: build the SQLite index, drive the environment by hand"),
    "generate": ("pipeline.stages.generate", "a prompted teacher answers questions with each method -> trajectories"),
    "filter": ("pipeline.stages.filter", "keep correct trajectories -> one SFT dataset per method"),
    "train": ("pipeline.stages.train", "launch pipeline/finetune.py with accelerate for a student and method"),
    "grpo": ("pipeline.stages.grpo", "reinforcement learning (GRPO) of a student acting in the environment"),
    "eval": ("pipeline.stages.eval", "run prompted or fine-tuned models through the environment -> EM/F1"),
    "plot": ("pipeline.stages.plot", "summaries -> the paper's figure 3 (prompting vs fine-tuning) and a table"),
    "run": ("pipeline.stages.run", "an experiment grid in phases: generate -> filter -> train -> grpo -> eval -> rounds -> plot"),
    "publish": ("pipeline.stages.publish", "package an SFT dataset or a checkpoint with its card; upload it to the hub"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline",
        description="ReAct fine-tuning pipeline: bootstrap trajectories with a teacher, "
        "fine-tune students, evaluate, plot.",
    )
    sub = parser.add_subparsers(dest="stage", metavar="STAGE")
    for name, (_, help_text) in STAGES.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a stage. Bad input (PipelineError) and what the operating system refuses (OSError:
    permissions, a full disk, too many open files), raised anywhere, end in one line, exit 2."""
    def run() -> int:
        use_lines_off_terminal()  # progress bars as periodic lines in a log file
        return run_stage(argv)

    try:
        return one_line_errors(run)
    except KeyboardInterrupt:
        print("interrupted: finished work is saved; re-run the same command to resume", file=sys.stderr)
        return 130


def run_stage(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] not in STAGES:
        parser.parse_args(argv or ["--help"])  # prints help / an "invalid choice" error and exits
        return 2
    stage, rest = argv[0], argv[1:]
    module_name, help_text = STAGES[stage]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            print(f"error: stage '{stage}' is not built yet ({module_name} is missing)", file=sys.stderr)
            return 2
        raise
    stage_parser = argparse.ArgumentParser(prog=f"python -m pipeline {stage}", description=help_text)
    module.add_arguments(stage_parser)
    return int(module.main(parse_stage_args(stage_parser, rest)) or 0)


def parse_stage_args(parser: argparse.ArgumentParser, rest: list[str]) -> argparse.Namespace:
    """Flags and key=value overrides in any order, as users type them (`max_steps=2 --dry-run
    limit=4`); a stage with sub-commands (`wiki build`, `data split`) parses as argparse does."""
    if any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
        return parser.parse_args(rest)
    return parser.parse_intermixed_args(rest)
