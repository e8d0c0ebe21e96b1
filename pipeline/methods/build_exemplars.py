"""Regenerate and check our own exemplars: observations come from OUR environment.

exemplars/authored.json holds 6 offline-bootstrap questions with hand-written thoughts, actions
(ReAct) and reasoning (CoT). This script replays each ReAct action through WikiEnv over the local
index, so every observation is exactly what a model would see, checks that each episode ends in
`Finish[gold]` with reward 1, and renders the four formats as ablations of that one trajectory:
react (thoughts + actions + observations), act (no thoughts), cot (reasoning), standard (answer).

The bm25 search mode (wiki.search=bm25) has its own exemplars, built the same way into
exemplars/bm25/: ours (the same authored thoughts and actions, observations from the retriever,
at the default k of 3 pages), and the paper's (`paper.json`: the six ReAct and Act exemplars of
prompts_naive.json with their thoughts and actions kept and each observation replaced by the
retriever's; CoT and Standard have no observation and are kept verbatim).

    python -m pipeline.methods.build_exemplars --index data/wiki/index.sqlite           # check
    python -m pipeline.methods.build_exemplars --index data/wiki/index.sqlite --write   # rewrite
    python -m pipeline.methods.build_exemplars --index data/wiki/index.sqlite --search bm25 --write
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.storage import atomic_write_json
from pipeline.core.trajectory import FORMATS, Step, Trajectory, one_line
from pipeline.methods.prompts import exemplar_dir, our_exemplar_file, paper_replay_file
from pipeline.tasks import get_task
from pipeline.wiki.actions import parse_action
from pipeline.wiki.backend import WikiBackend
from pipeline.wiki.env import DEFAULT_SEARCH_K, WikiEnv

HOTPOTQA = get_task("hotpotqa")  # the task our exemplars are written for (its exemplar_dir holds them)
EXEMPLAR_DIR = HOTPOTQA.exemplar_dir
AUTHORED = EXEMPLAR_DIR / "authored.json"


def load_authored(path: Path = AUTHORED) -> list[dict]:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))["exemplars"]
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        raise PipelineError(f"{path}: cannot read the authored exemplars ({exc})") from None


def replay(item: dict, backend: WikiBackend, search: str = "title") -> Trajectory:
    """The ReAct trajectory of one authored exemplar, with observations from the environment."""
    env = WikiEnv(backend, max_steps=len(item["react"]), score=HOTPOTQA.scores, search=search,
                  search_k=DEFAULT_SEARCH_K)
    env.reset(item["question"], item["answer"])
    traj = Trajectory(item["question"], "react")
    for step in item["react"]:
        observation, reward, done, info = env.step(step["action"])
        traj.steps.append(Step(step["thought"], step["action"], one_line(observation)))
    if not (info["finished"] and reward == 1.0):
        raise PipelineError(f"exemplar {item['id']}: the replayed episode does not end in Finish[gold] with "
                            f"reward 1 (last observation: {observation!r}); fix authored.json")
    traj.answer = info["answer"]
    return traj


def build(backend: WikiBackend, authored: list[dict], search: str = "title") -> dict[str, list[dict]]:
    """{format: [{id, gold_answer, trajectory}]} for the four formats."""
    out: dict[str, list[dict]] = {fmt: [] for fmt in FORMATS}
    for item in authored:
        react = replay(item, backend, search)
        act = Trajectory(react.question, "act", [Step(None, s.action, s.observation) for s in react.steps],
                         react.answer)
        cot = Trajectory(item["question"], "cot", answer=item["answer"], reasoning=item["cot"])
        standard = Trajectory(item["question"], "standard", answer=item["answer"])
        for traj in (react, act, cot, standard):
            out[traj.format].append({"id": item["id"], "gold_answer": item["answer"], "trajectory": traj.to_dict()})
    return out


def replay_paper(prompts: dict[str, str], backend: WikiBackend, search: str = "bm25") -> dict[str, str]:
    """The paper's exemplar texts (prompts_naive.json's HotpotQA keys) with each `Observation i:`
    line replaced by what our environment in `search` mode answers to the `Action i:` before it
    (a fresh episode per `Question:`); thoughts, actions and the rest are kept verbatim."""
    out = {}
    for key in HOTPOTQA.paper_keys.values():
        lines, observed = [], None
        for line in prompts[key].split("\n"):
            if line.startswith("Question:"):
                env = WikiEnv(backend, max_steps=99, search=search, search_k=DEFAULT_SEARCH_K)
                env.reset(line)
            head, _, body = line.partition(": ")
            if head.startswith("Action ") and parse_action(body) is not None:
                observed = one_line(env.step(body)[0])
            elif head.startswith("Observation ") and observed is not None:
                line, observed = f"{head}: {observed}", None
            lines.append(line)
        out[key] = "\n".join(lines)
    return out


def paper_replayed(backend: WikiBackend, search: str) -> dict[str, str]:
    from pipeline.core.paths import resolve_source

    return replay_paper(json.loads(resolve_source(HOTPOTQA.paper_prompts).read_text(encoding="utf-8")), backend, search)


def write_paper(backend: WikiBackend, directory: Path, search: str = "bm25") -> Path:
    path = paper_replay_file(directory)
    atomic_write_json(path, paper_replayed(backend, search))
    return path


def check(backend: WikiBackend, directory: Path = EXEMPLAR_DIR, authored: list[dict] | None = None,
          search: str = "title") -> list[str]:
    """Differences between the stored exemplar files and a fresh replay (empty: all match)."""
    fresh = build(backend, authored if authored is not None else load_authored(AUTHORED), search)
    problems = []
    for fmt, records in fresh.items():
        path = our_exemplar_file(fmt, directory)
        stored = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        if stored != records:
            problems.append(f"{path}: differs from a replay through the environment "
                            "(rerun with --write after checking why)")
    paper = paper_replay_file(directory)
    if search != "title" and (not paper.is_file() or json.loads(paper.read_text(encoding="utf-8"))
                              != paper_replayed(backend, search)):
        problems.append(f"{paper}: differs from the paper's exemplars replayed in wiki.search={search} "
                        "(rerun with --write after checking why)")
    return problems


def check_questions(authored: list[dict], question_set: str = "offline-bootstrap") -> list[str]:
    """Each exemplar must be a question of the bootstrap pool, with the same text and answer."""
    by_id = {q.id: q for q in HOTPOTQA.load_questions(question_set)}
    problems = []
    for item in authored:
        q = by_id.get(item["id"])
        if q is None:
            problems.append(f"exemplar {item['id']} is not in {question_set}")
        elif (q.question.strip(), q.answer) != (item["question"].strip(), item["answer"]):
            problems.append(f"exemplar {item['id']}: question or answer differs from {question_set}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--index", required=True, help="the local wiki index (python -m pipeline wiki build)")
    parser.add_argument("--write", action="store_true", help="rewrite the four exemplar files")
    parser.add_argument("--search", choices=["title", "bm25"], default="title",
                        help="the wiki.search mode whose exemplars to build (bm25: exemplars/bm25/, the paper's too)")
    args = parser.parse_args(argv)
    directory = exemplar_dir(HOTPOTQA, args.search)
    from pipeline.wiki.index import LocalIndex

    try:
        backend = LocalIndex(args.index)
        authored = load_authored()
        problems = check_questions(authored)
        if args.write:
            directory.mkdir(exist_ok=True)
            for fmt, records in build(backend, authored, args.search).items():
                atomic_write_json(our_exemplar_file(fmt, directory), records)
                print(f"wrote {our_exemplar_file(fmt, directory)} ({len(records)} exemplars)")
            if args.search != "title":
                print(f"wrote {write_paper(backend, directory, args.search)} (the paper's, observations replayed)")
        problems += check(backend, directory, authored, args.search)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for p in problems:
        print(f"problem: {p}", file=sys.stderr)
    if not problems:
        print(f"ok: {len(authored)} exemplars per format match a replay over {args.index}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
