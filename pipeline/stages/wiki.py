"""`python -m pipeline wiki ...`: build the local Wikipedia index and drive the environment by hand.

    python -m pipeline wiki build                                   # the offline corpus -> data/wiki/
    python -m pipeline wiki build --corpus ../shared/data/wiki/corpus.jsonl --out data/wiki/hotpotqa-local.sqlite
    python -m pipeline wiki build --corpus enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2 --out data/wiki/enwiki-2017.sqlite
    python -m pipeline wiki build --corpus ../shared/data/react/fever_react_davinci002_500_trajs.jsonl \
        --out data/wiki/fever-observed.sqlite                      # FEVER's offline pages (pipeline/wiki/observed.py)
    python -m pipeline wiki step 'Search[Milhouse Van Houten]' 'Lookup[Matt Groening]' 'Finish[Simpson]' \
        --question "Who named Milhouse?" --answer "Richard Nixon"
    python -m pipeline wiki search "Adam Clayton Powell"            # the page, or the similar titles
    python -m pipeline wiki info                                    # what the index was built from
    python -m pipeline wiki replay                                  # released trajectories vs our env

`step` prints one JSON object per action: {"action", "observation", "reward", "done", "info"}.
Every failure is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.core.config import int_at_least
from pipeline.core.errors import PipelineError
from pipeline.methods.base import MethodSettings
from pipeline.wiki.config import WikiConfig, resolve_corpus

DEFAULTS = WikiConfig()
REPLAY_DEFAULTS = ("mirror:react/prompts_naive.json", "mirror:react/fever_react_davinci002_500_trajs.jsonl",
                   "mirror:fireact/alpaca_format/hotpotqa.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    build = sub.add_parser("build", help="index corpus files into one SQLite file")
    build.add_argument("--corpus", nargs="+", default=None, metavar="PATH",
                       help="page sources: corpus JSONL, HotpotQA JSON/JSONL, the enwiki-2017 dump (.tar.bz2, "
                            "folder or .bz2 shard), a wikimedia/wikipedia .parquet/.arrow; beside them, "
                            "redirects: a pages-articles .xml[.bz2] dump or a from<TAB>to .tsv; "
                            f"default: {' '.join(DEFAULTS.corpus)}")
    build.add_argument("--out", type=Path, default=DEFAULTS.index, help=f"index file (default {DEFAULTS.index})")
    build.add_argument("--no-progress", action="store_true", help="no progress bar")

    step = sub.add_parser("step", help="run actions through WikiEnv, one JSON line per action")
    _add_index(step)
    step.add_argument("actions", nargs="+", metavar="ACTION", help="e.g. 'Search[Milhouse]' 'Lookup[Nixon]'")
    step.add_argument("--question", default="", help="the question (only echoed by reset)")
    step.add_argument("--answer", default=None, help="gold answer: Finish[...] then scores it (the task's metric)")
    step.add_argument("--task", default="hotpotqa", help="whose metric scores a Finish: hotpotqa (EM/F1, default) or fever")
    step.add_argument("--max-steps", type=int_at_least(1, "--max-steps"), default=MethodSettings.max_steps, help="step limit (default 7)")
    step.add_argument("--style", choices=["clean", "original"], default=DEFAULTS.observation_style,
                      help="observation style (default clean; original = wikienv.py's text and rules)")

    search = sub.add_parser("search", help="look a title up; on a miss list similar titles")
    _add_index(search)
    search.add_argument("query")
    search.add_argument("-k", type=int_at_least(1, "-k"), default=5, help="similar titles to list (default 5)")

    info = sub.add_parser("info", help="print the index's meta data (sources, counts, build time)")
    _add_index(info)

    replay = sub.add_parser(
        "replay", help="replay released trajectories' actions; report agreement per action kind",
        description="Step the actions of released trajectories through WikiEnv and compare each "
        "observation with the recorded one (same hit/miss, same first sentence, identical).")
    _add_index(replay)
    replay.add_argument("files", nargs="*", metavar="FILE",
                        help="prompts_naive.json, ReAct's FEVER trajs .jsonl, FireAct alpaca .json; "
                        f"default: {' '.join(REPLAY_DEFAULTS)}")
    replay.add_argument("--style", choices=["original", "clean"], default="original",
                        help="observation style (default original, the paper's)")
    replay.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")


def _add_index(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--index", type=Path, default=DEFAULTS.index, help=f"index file (default {DEFAULTS.index})")


def main(args: argparse.Namespace) -> int:
    return {"build": build, "step": step, "search": search, "info": info, "replay": replay}[args.command](args)


def build(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from pipeline.core.storage import check_writable_dir, remove_stale_temps
    from pipeline.wiki.index import build_index, check_sources

    sources = check_sources(resolve_corpus(spec) for spec in (args.corpus or DEFAULTS.corpus))
    check_writable_dir(args.out.parent, f"--out {args.out}")  # before minutes of indexing
    remove_stale_temps(args.out.parent, args.out.name)  # a killed build's half-written index
    with tqdm(unit=" pages", unit_scale=True, desc="indexing", disable=args.no_progress,
              mininterval=1.0, delay=1.0, file=sys.stderr) as bar:
        stats = build_index(sources, args.out, progress=bar.update)
    print(f"indexed {stats.pages:,} pages from {len(sources)} source(s) in {stats.seconds:.1f} s "
          f"({stats.pages_per_second:,.0f} pages/s); skipped {stats.duplicate_titles:,} duplicate titles; "
          f"{args.out} ({stats.bytes / 1e6:.1f} MB)")
    return 0


def step(args: argparse.Namespace) -> int:
    from pipeline.tasks import get_task
    from pipeline.wiki.env import WikiEnv
    from pipeline.wiki.index import LocalIndex

    score = get_task(args.task).scores
    with LocalIndex(args.index) as index:
        env = WikiEnv(index, max_steps=args.max_steps, style=args.style, score=score)
        env.reset(args.question, args.answer)
        for action in args.actions:
            observation, reward, done, info = env.step(action)
            record = {"action": action, "observation": observation, "reward": reward, "done": done, "info": info}
            print(json.dumps(record, ensure_ascii=False), flush=True)
    return 0


def search(args: argparse.Namespace) -> int:
    from pipeline.wiki.env import SENTENCES_SHOWN
    from pipeline.wiki.index import LocalIndex

    with LocalIndex(args.index) as index:
        page = index.get_page(args.query)
        if page is not None:
            print(json.dumps({"title": page.title, "sentences": page.sentences[:SENTENCES_SHOWN],
                              "disambiguation": page.is_disambiguation}, ensure_ascii=False))
        else:
            print(json.dumps({"title": None, "similar": index.similar_titles(args.query, args.k)},
                             ensure_ascii=False))
    return 0


def info(args: argparse.Namespace) -> int:
    from pipeline.wiki.index import LocalIndex

    with LocalIndex(args.index) as index:
        print(json.dumps({"path": str(index.path), **index.meta}, indent=2, ensure_ascii=False))
    return 0


def replay(args: argparse.Namespace) -> int:
    from pipeline.core.storage import atomic_write_json
    from pipeline.wiki.index import LocalIndex
    from pipeline.wiki.replay import replay as run_replay

    try:
        files = [resolve_corpus(f) for f in (args.files or REPLAY_DEFAULTS)]
    except PipelineError:
        raise PipelineError("the released trajectories are not in a local data mirror; give their paths "
                            "(prompts_naive.json, fever_react_davinci002_500_trajs.jsonl, FireAct's "
                            "alpaca_format/hotpotqa.json) or set REACT_PIPELINE_MIRROR") from None
    with LocalIndex(args.index) as index:
        report = run_replay(index, files, args.style)
        print(f"index {index.path} ({index.page_count:,} pages), observation style {args.style}")
    print(report.markdown())
    if args.json is not None:
        atomic_write_json(args.json, {"index": str(args.index), "style": args.style, "rows": report.rows(),
                                      "trajectories": report.trajectories})
    return 0
