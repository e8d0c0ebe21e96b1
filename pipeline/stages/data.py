"""`python -m pipeline data`: fetch or locate the data files, show question sets, build splits.

    python -m pipeline data fetch prompts                      # the paper's exemplars -> data/react/
    python -m pipeline data fetch hotpotqa --split dev-distractor
    python -m pipeline data fetch wiki-abstracts               # enwiki-2017 intros (tar.bz2)
    python -m pipeline data fetch fever                        # FEVER's paper_dev.jsonl (fever-prompts: its exemplars)
    python -m pipeline data show react-dev500 --sample 3
    python -m pipeline data show offline-eval --task fever
    python -m pipeline data split --seed 0                     # -> splits/offline-v1/
    python -m pipeline data build                              # the offline data folder (../shared/data) from its sources

Each file resolves as: explicit path > data/ cache > local mirror (../shared/data) > download.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from pipeline.core.config import int_at_least
from pipeline.core.errors import PipelineError

FETCH_SOURCES = {
    "prompts": "react-prompts",
    "wiki-abstracts": "wiki-abstracts",
    "wiki-processed": "wiki-processed",
    "fever": "fever-paper-dev",
    "fever-prompts": "react-fever-prompts",
}
HOTPOT_SPLITS = {
    "train": "hotpotqa-train",
    "dev-distractor": "hotpotqa-dev-distractor",
    "dev-fullwiki": "hotpotqa-dev-fullwiki",
    "dev-simplified": "hotpotqa-dev-simplified",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    fetch = sub.add_parser("fetch", help="locate a data file, downloading it into data/ if needed",
                           description="Resolve a file: data/ cache > local mirror > official download.")
    fetch.add_argument("what", choices=["prompts", "hotpotqa", "wiki-abstracts", "wiki-processed", "fever",
                                        "fever-prompts"],
                       help="prompts: ReAct's prompts_naive.json; hotpotqa: an official HotpotQA file; "
                       "wiki-abstracts: HotpotQA's enwiki-2017 intro dump; wiki-processed: its "
                       "full-article dump (every paragraph); fever: FEVER's paper_dev.jsonl as the ReAct "
                       "repo ships it; fever-prompts: ReAct's fever.json exemplars")
    fetch.add_argument("--split", choices=list(HOTPOT_SPLITS), default="dev-distractor",
                       help="which HotpotQA file (with `fetch hotpotqa`; default dev-distractor)")
    fetch.add_argument("--force", action="store_true",
                       help="download into data/ even if the cache or the mirror already has the file")

    show = sub.add_parser("show", help="print counts and a sample of a question set",
                          description="Counts (split, type, level, context) and a few questions.")
    show.add_argument("name", help="react-dev500, offline-eval, offline-bootstrap, dev, train, "
                      "hf:distractor:validation, or a path to a HotpotQA file (with --task fever: "
                      "paper-dev, react-dev500, dev-bootstrap, offline-eval, offline-bootstrap, a FEVER .jsonl)")
    show.add_argument("--task", default="hotpotqa", help="the task whose question set it is: hotpotqa (default) or fever")
    show.add_argument("--limit", type=int_at_least(1, "--limit"), default=None, help="only the first N questions")
    show.add_argument("--sample", type=int_at_least(1, "--sample"), default=3, help="how many questions to print (default 3)")

    split = sub.add_parser("split", help="build the offline eval / bootstrap id lists",
                           description="Seeded offline benchmark split of with_context.jsonl: an eval "
                           "set of dev questions whose gold paragraphs are all in the corpus, and a "
                           "disjoint bootstrap pool (train + remaining dev, minus react-dev500).")
    split.add_argument("--seed", type=int_at_least(0, "--seed"), default=0, help="shuffle seed (default 0)")
    split.add_argument("--eval-size", type=int_at_least(1, "--eval-size"), default=500, help="eval questions (default 500)")
    split.add_argument("--questions", type=Path, default=None,
                       help="with_context.jsonl (default: data/ cache, then the mirror)")
    split.add_argument("--corpus", type=Path, default=None,
                       help="wiki corpus JSONL of {title, ...} (default: data/ cache, then the mirror)")
    split.add_argument("--out", type=Path, default=None, help="output folder (default splits/offline-v1)")

    build = sub.add_parser("build", help="build the offline data folder from its public sources (network)",
                           description="Download HotpotQA's official files and the ReAct and FireAct "
                           "repositories' files, build with_context.jsonl and the local Wikipedia from "
                           "them, and check the offline split on the result (docs/data.md).")
    build.add_argument("--out", type=Path, default=None,
                       help="the folder to fill (default: where the stages look for it: "
                       "$REACT_PIPELINE_MIRROR, else ../shared/data beside the repository)")
    build.add_argument("--force", action="store_true", help="download and build every file again")
    for source in ("hotpotqa", "react", "fireact"):
        build.add_argument(f"--{source}-url", default=None, metavar="URL",
                           help=f"a mirror of {source}'s files (default: where it publishes them)")


def main(args: argparse.Namespace) -> int:
    return {"fetch": fetch, "show": show, "split": split, "build": build}[args.command](args)


def fetch(args: argparse.Namespace) -> int:
    from pipeline.core.paths import SOURCES, data_dir, resolve_source

    name = HOTPOT_SPLITS[args.split] if args.what == "hotpotqa" else FETCH_SOURCES[args.what]
    path = resolve_source(name, force_download=args.force)
    where = "data/ cache" if path.resolve().is_relative_to(data_dir().resolve()) else "local mirror"
    if name == "react-prompts":
        _check_prompts(path)
    print(f"{SOURCES[name].description}: {path} ({where}, {path.stat().st_size:,} bytes)")
    return 0


def _check_prompts(path: Path) -> None:
    try:
        prompts = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PipelineError(f"{path}: not valid JSON ({exc}); delete it and fetch again") from None
    if not isinstance(prompts, dict) or "webthink_simple6" not in prompts:
        raise PipelineError(f"{path}: has no 'webthink_simple6' exemplars; is this ReAct's prompts_naive.json?")


def show(args: argparse.Namespace) -> int:
    from pipeline.tasks import get_task

    task = get_task(args.task)
    questions = task.load_questions(args.name, limit=args.limit)
    print(f"{args.name}: {len(questions)} questions")
    facts = [task.question_facts(q) for q in questions]
    for label in facts[0] if facts else []:
        counts = Counter(f[label] for f in facts).most_common()
        print(f"  {label:8s} " + ", ".join(f"{k}: {v}" for k, v in counts))
    for q in questions[: max(args.sample, 0)]:
        print(task.describe(q))
    return 0


def split(args: argparse.Namespace) -> int:
    """HotpotQA's offline split (the only task with one to build: FEVER's sets are the release's)."""
    from pipeline.tasks import get_task

    print(get_task("hotpotqa").write_split(args.out, questions=args.questions, corpus=args.corpus, seed=args.seed,
                                           eval_size=args.eval_size))
    return 0


def build(args: argparse.Namespace) -> int:
    from pipeline.hub.offline_data import build_offline_data, default_folder

    urls = {s: getattr(args, f"{s}_url") for s in ("hotpotqa", "react", "fireact") if getattr(args, f"{s}_url")}
    build_offline_data(args.out or default_folder(), urls, force=args.force)
    return 0
