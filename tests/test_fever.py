"""FEVER, the second task, through the task seam: its claims, labels and accuracy (as the
original FeverWrapper scores them), the paper's 3-shot exemplars, the offline corpus rebuilt from
ReAct's 500 released FEVER trajectories (a real SQLite index), the replay stand-in teacher, and
generate -> filter -> train -> eval -> plot on a tiny grid made from configs/fever.yaml, with a
second self-training round.

    .venv/bin/python -m pytest tests/test_fever.py -q
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from episode_testdata import REPO, read_records, run_pipeline

from pipeline.agent.scheduler import run_episodes
from pipeline.core.errors import PipelineError
from pipeline.llm.scripted import ScriptedLLM
from pipeline.methods import MethodSettings, build_method
from pipeline.methods.prompts import load_prompt, paper_prefix
from pipeline.tasks import get_task
from pipeline.tasks.fever import LABELS, react_sample, read_claims

FEVER = get_task("fever")
TRAJS = "react/fever_react_davinci002_500_trajs.jsonl"


def released(shared_data: Path) -> list[dict]:
    return [json.loads(line) for line in (shared_data / TRAJS).read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def fever_index(shared_data, tmp_path_factory) -> Path:
    """The offline FEVER pages, built by `python -m pipeline wiki build` from the trajectories."""
    out = tmp_path_factory.mktemp("fever-wiki") / "fever.sqlite"
    proc = run_pipeline("wiki", "build", "--corpus", str(shared_data / TRAJS), "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "indexed 346 pages from 1 source(s)" in proc.stdout
    return out


def test_labels_and_accuracy_are_the_original_wrappers():
    assert FEVER.answer_space == LABELS == ("SUPPORTS", "REFUTES", "NOT ENOUGH INFO")
    assert FEVER.scores("not enough info", "NOT ENOUGH INFO") == {"em": 1.0, "f1": 1.0}  # normalised, as FeverWrapper
    assert FEVER.scores("SUPPORTS.", "SUPPORTS") == {"em": 1.0, "f1": 1.0}
    assert FEVER.scores("SUPPORTS", "REFUTES") == {"em": 0.0, "f1": 0.0}
    assert FEVER.scores("NOT ENOUGH", "NOT ENOUGH INFO") == {"em": 0.0, "f1": 0.0}  # no partial credit
    assert FEVER.score(None, "SUPPORTS") == 0.0 and FEVER.score("refutes", "REFUTES") == 1.0
    assert FEVER.is_correct({"em": 1.0}) and not FEVER.is_correct({"em": 0.0})
    assert (FEVER.question_label, FEVER.metric_label, FEVER.hybrid_react_steps) == ("Claim", "accuracy", 5)


def test_question_sets_are_the_notebooks_sample_and_disjoint_pools(shared_data):
    dev = FEVER.load_questions("paper-dev")
    assert len(dev) == 9999 and len({c.id for c in dev}) == 9999
    sample = FEVER.load_questions("react-dev500")
    runs = released(shared_data)
    # the notebook's Random(233) sample is exactly the released trajectories' claims, in their order
    assert [c.index for c in sample] == react_sample() == [r["question_idx"] for r in runs]
    assert [c.question for c in sample] == [r["claim"] for r in runs]
    assert [c.answer for c in sample] == [r["info"]["gt_answer"] for r in runs]
    offline_eval, bootstrap = FEVER.load_questions("offline-eval"), FEVER.load_questions("offline-bootstrap")
    assert (len(offline_eval), len(bootstrap)) == (100, 400)
    assert {c.id for c in offline_eval} | {c.id for c in bootstrap} == {c.id for c in sample}
    assert not {c.id for c in offline_eval} & {c.id for c in bootstrap}
    pool = FEVER.load_questions("dev-bootstrap")
    assert len(pool) == 9499 and not {c.id for c in pool} & {c.id for c in sample}
    assert FEVER.load_questions("offline-eval", limit=3) == offline_eval[:3]
    with pytest.raises(PipelineError, match="unknown FEVER question set 'dev500'"):
        FEVER.load_questions("dev500")


def test_a_claims_file_of_its_own_is_not_checked_against_the_released_line_it_shares_an_index_with(shared_data):
    """The index check reads a claim's pages from ReAct's released trajectory of that paper_dev line:
    a claim of another file at the same line (here a made-up one) has no known pages (None), where
    keying by line alone refused a test world's own index (3 of 3 'missing')."""
    from pipeline.tasks.fever import Claim, local_trajectories

    task, released = get_task("fever"), local_trajectories()
    line, trajectory = next(iter(released.items()))
    ours = Claim(id="c-kilo", question="The colour of kilo is gold.", answer="SUPPORTS", index=line)
    assert task.lacks_pages(ours, lambda title: False) is None
    theirs = Claim(id="paper", question=trajectory.claim, answer="SUPPORTS", index=line)
    assert task.lacks_pages(theirs, lambda title: False) is True


def test_a_bad_claims_file_names_its_line(tmp_path):
    path = tmp_path / "claims.jsonl"
    path.write_text('{"id": 1, "claim": "A.", "label": "SUPPORTS"}\n{"id": 2, "claim": "B.", "label": "MAYBE"}\n')
    with pytest.raises(PipelineError, match=r"claims.jsonl:2: label 'MAYBE' is not one of SUPPORTS"):
        read_claims(path)
    path.write_text('{"id": 1, "claim": "A.", "label": "SUPPORTS"}\n')
    assert [(c.id, c.question, c.answer, c.index) for c in FEVER.load_questions(str(path))] == [("1", "A.", "SUPPORTS", 0)]


def test_the_papers_three_exemplars_per_format_verbatim(shared_data):
    path = shared_data / "react" / "fever.json"
    raw = json.loads(path.read_text())
    for fmt, key in FEVER.paper_keys.items():
        prefix = paper_prefix(fmt, task=FEVER)  # through the data resolver, as `exemplars: paper`
        assert prefix.exemplars == raw[key].rstrip("\n") + "\n" and prefix.instruction == ""
        assert prefix.source == f"paper:{path}#{key}" and prefix.exemplars.count("\nClaim: ") + \
            prefix.exemplars.startswith("Claim: ") == 3
    with pytest.raises(PipelineError, match="the FEVER task has no exemplars of ours; set prompting.exemplars=paper"):
        load_prompt("react", "ours", FEVER)
    assert FEVER.exemplar_sets == ("paper",)  # the fact `run`'s compare_exemplars reads, from its folder-less task


def test_the_hybrids_react_has_five_steps_on_fever_and_seven_on_hotpotqa(shared_data):
    settings = MethodSettings(exemplars="paper")
    fever_first = build_method("react_to_cot_sc", settings, FEVER)
    fever_second = build_method("cot_sc_to_react", settings, FEVER)
    assert fever_first.primary.settings.max_steps == fever_second.secondary.settings.max_steps == 5
    assert build_method("react", settings, FEVER).settings.max_steps == 7  # plain ReAct: the notebook's loop
    assert build_method("react_to_cot_sc", settings).primary.settings.max_steps == 7


def test_a_prompted_react_episode_reads_the_papers_prompt_and_is_scored_by_accuracy(shared_data, fever_index):
    from pipeline.wiki.index import LocalIndex

    claim = FEVER.load_questions("react-dev500")[0]
    assert (claim.question, claim.answer) == ("Paramore is not from Tennessee.", "REFUTES")
    outputs = [" I should search for Paramore.\nAction 1: Search[Paramore]",
               " It is from Franklin, Tennessee.\nAction 2: Finish[refutes]"]
    llm = ScriptedLLM(outputs)
    method = build_method("react", MethodSettings(exemplars="paper"), FEVER)
    with LocalIndex(fever_index) as index:
        [record] = run_episodes(llm, lambda: index, [claim], method)
    raw = json.loads((shared_data / "react" / "fever.json").read_text())["webthink_simple3"]
    assert llm.prompts[0] == raw.rstrip("\n") + "\nClaim: Paramore is not from Tennessee.\nThought 1:"
    assert (record["prediction"], record["em"], record["f1"], record["end_reason"]) == ("refutes", 1.0, 1.0, "finish")
    assert record["text"].startswith("Claim: Paramore is not from Tennessee.\nThought 1: I should search")
    assert record["steps"][0]["observation"].startswith("Paramore is an American rock band from Franklin, Tennessee")
    assert record["steps"][1]["observation"] == "Episode finished, reward = 1"
    assert record["trajectory"]["question_label"] == "Claim"

    standard = ScriptedLLM([" NOT ENOUGH INFO"])
    with LocalIndex(fever_index) as index:
        [wrong] = run_episodes(standard, lambda: index, [claim],
                               build_method("standard", MethodSettings(exemplars="paper"), FEVER))
    assert standard.prompts[0].endswith("\nClaim: Paramore is not from Tennessee.\nAnswer:")
    assert (wrong["prediction"], wrong["em"]) == ("NOT ENOUGH INFO", 0.0)


def test_the_observed_corpus_answers_the_released_searches_as_they_were_answered(shared_data, fever_index):
    """Every released Search that hit hits here and every miss misses; in the clean style 452 of
    the 479 hits (94%) show the recorded text exactly (once the scraping's chrome is dropped)."""
    from pipeline.wiki.actions import env_action
    from pipeline.wiki.env import WikiEnv
    from pipeline.wiki.index import LocalIndex
    from pipeline.wiki.replay import SCRAPING_CHROME, read_trajectories

    hits = same = misses = 0
    with LocalIndex(fever_index) as index:
        for recorded in read_trajectories(shared_data / TRAJS):
            env = WikiEnv(index, max_steps=50, style="clean")
            env.reset(recorded.question)
            for action, theirs in recorded.steps:
                ours, *_ = env.step(env_action(action))
                if not action.lower().startswith("search"):
                    continue
                assert ours.startswith("Could not find") == theirs.startswith("Could not find"), (action, ours)
                if theirs.startswith("Could not find"):
                    misses += 1
                    continue
                hits += 1
                same += ours == theirs.strip().removeprefix(SCRAPING_CHROME).strip()
    assert (hits, misses) == (479, 51) and same / hits > 0.9


def generate(tmp_path: Path, index: Path, shared_data: Path, *args: str) -> Path:
    out = tmp_path / "gen"
    proc = run_pipeline("generate", "task=fever", "oracle=exact", "methods=[standard,cot,act,react]",
                        "questions=offline-bootstrap", f"wiki.index={index}", f"wiki.corpus=[{shared_data / TRAJS}]",
                        f"out_dir={out}", *args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_replay_teacher_gives_the_released_answers_and_filter_keeps_the_correct(tmp_path, shared_data, fever_index):
    out = generate(tmp_path, fever_index, shared_data, "limit=40")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"] == "fever" and manifest["exemplar_sources"]["react"]["source"].startswith("oracle: a replay")
    by_index = {r["question_idx"]: r for r in released(shared_data)}
    claims = {c.id: c for c in FEVER.load_questions("offline-bootstrap", limit=40)}
    for fmt in ("standard", "cot", "act", "react"):
        records = read_records(out / f"{fmt}.jsonl")
        assert len(records) == 40 and all(r["text"].startswith("Claim: ") and r["teacher"] == "oracle" for r in records)
        for r in records:
            run = by_index[claims[r["id"]].index]
            if r["end_reason"] == "finish":  # the released answer, scored by accuracy as the release scored it
                assert r["em"] == run["info"]["em"], (fmt, r["id"])
            if fmt == "react":
                assert [s["action"] for s in r["steps"]] == [line.split(": ", 1)[1] for line in run["traj"].split("\n")
                                                             if line.startswith("Action ")][:len(r["steps"])]
    correct = sum(r["em"] == 1.0 for r in read_records(out / "react.jsonl"))
    assert 10 <= correct < 40  # about half the released answers are right

    sft = tmp_path / "sft"
    proc = run_pipeline("filter", f"inputs=[{out}]", f"out_dir={sft}")
    assert proc.returncode == 0, proc.stderr
    rows = read_records(sft / "react" / "train.jsonl")
    assert len(rows) == correct and all(r["prompt"].startswith("Claim: ") for r in rows)
    assert json.loads((sft / "react" / "manifest.json").read_text())["task"] == "fever"
    card = (sft / "react" / "README.md").read_text()
    assert "# SFT dataset: FEVER, react trajectories" in card and "with the gold label (accuracy 1)" in card

    # an input of another task is refused, in one line
    other = tmp_path / "other"
    other.mkdir()
    for p in out.iterdir():
        (other / p.name).write_bytes(p.read_bytes())
    old = json.loads((other / "manifest.json").read_text())
    del old["task"], old["config"]["task"]  # a manifest older than the key: HotpotQA's
    (other / "manifest.json").write_text(json.dumps(old))
    proc = run_pipeline("filter", f"inputs=[{out},{other}]", f"out_dir={tmp_path / 'mixed'}")
    assert proc.returncode == 2 and "the inputs answer different tasks" in proc.stderr
    assert f"{other}: hotpotqa" in proc.stderr and not (tmp_path / "mixed").exists()


def test_a_fever_plot_draws_accuracy_beside_the_papers_points_and_refuses_a_second_task(tmp_path):
    from pipeline.stages.plot import PlotConfig, run_plot

    rows = [{"model": "tiny", "size_class": "135m", "params_b": 0.135, "mode": mode, "method": m,
             "question_set": "offline-eval", "n": 10, "em": 0.5, "f1": 0.5, "source": "ours", "task": "fever"}
            for mode in ("prompt", "finetune") for m in ("standard", "cot", "act", "react")]
    summary = tmp_path / "fever.json"
    summary.write_text(json.dumps(rows))
    paths = run_plot(PlotConfig(summaries=[str(summary)], out_dir=str(tmp_path / "plot")))
    md, orderings = paths["md"].read_text(), paths["orderings"].read_text()
    assert md.startswith("# FEVER accuracy (%) by model size: offline-eval")
    assert "| paper | PaLM-540B (ReAct paper) | prompt | ReAct | 60.9 |" in md  # Table 1
    assert "it states no orderings for FEVER: none checked" in orderings
    assert json.loads(paths["orderings_json"].read_text()) == []
    hotpot = tmp_path / "hotpot.json"
    hotpot.write_text(json.dumps([{k: v for k, v in rows[0].items() if k != "task"}]))
    with pytest.raises(PipelineError, match="summaries of different tasks in one figure"):
        run_plot(PlotConfig(summaries=[str(summary), str(hotpot)], out_dir=str(tmp_path / "mixed")))


def test_the_shipped_fever_config_plans_every_unit_on_fever():
    from pipeline.core.config import build, read_yaml
    from pipeline.stages.run import RunConfig, Student, plan

    cfg = build(RunConfig, read_yaml(REPO / "configs" / "fever.yaml"))
    units = plan(cfg, [build(Student, s) for s in cfg.students])
    titles = [u.title for u in units]
    assert titles[0].startswith("generate") and titles[-1].startswith("plot")
    assert sum(t.startswith("train") for t in titles) == 4 and sum(t.startswith("eval") for t in titles) == 5
    staged = [u.config for u in units if u.title.startswith(("generate", "eval"))]
    assert {c.task for c in staged} == {"fever"} and {c.wiki.index.name for c in staged} == {"fever-observed.sqlite"}
    assert units[0].config.questions == "offline-bootstrap"


def tiny_fever_grid(tmp_path: Path, shared_data: Path, base: Path) -> Path:
    """configs/fever.yaml at toy scale: the tiny student, a tiny random base model prompted with
    the paper's exemplars, a few claims, two formats; and a second self-training round of ReAct,
    round 1's student sampling 2 episodes on each of 4 bootstrap claims."""
    config = yaml.safe_load((REPO / "configs" / "fever.yaml").read_text())
    config.update(out_dir=str(tmp_path / "run"), formats=["standard", "react"])
    config["wiki"] = {"index": str(tmp_path / "fever.sqlite"), "corpus": [str(shared_data / TRAJS)]}
    config["generate"]["limit"] = 24
    config["train"].update(output_root=str(tmp_path / "ckpt"), max_steps=2, global_batch_size=4,
                           accelerate_config="cpu", save_steps=2)
    config["eval"].update(limit=3, max_in_flight=3)
    config["eval"]["prompting"].update(max_new_tokens=8, max_steps=2)
    config["students"] = [{"name": "tiny", "config": str(REPO / "configs" / "students" / "tiny.yaml"),
                           "size_class": "tiny", "params_b": 0.0032, "train": {"max_steps": 2},
                           "prompt_model": {"backend": "transformers", "model": str(base), "name": "tiny-base"}}]
    config["self_training"] = {"rounds": 2, "formats": ["react"], "limit": 4, "samples": 2, "temperature": 1.0}
    path = tmp_path / "fever-grid.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_fever_grids_rounds_generate_and_eval_fever(tmp_path, shared_data):
    """The rounds follow the grid's task: round 2's teacher answers FEVER claims, its student is
    evaluated on FEVER."""
    from pipeline.core.config import build, read_yaml
    from pipeline.stages.run import RunConfig, Student, plan

    cfg = build(RunConfig, read_yaml(tiny_fever_grid(tmp_path, shared_data, tmp_path / "base")))  # planned, not run
    units = [u for u in plan(cfg, [build(Student, s) for s in cfg.students]) if u.phase == "rounds"]
    assert [u.title.split(" (")[0] for u in units] == ["generate", "filter", "train", "eval"]
    generate, _, _, ev = units
    assert (generate.config.task, ev.config.task) == ("fever", "fever")
    assert generate.config.teacher.name == "tiny round 1 (react)" and generate.config.oracle is None


@pytest.mark.slow
def test_fever_runs_generate_filter_train_eval_plot_and_a_round_on_the_offline_corpus(tmp_path, shared_data,
                                                                                       tiny_prompt_model):
    started = time.monotonic()
    proc = run_pipeline("run", "--config", str(tiny_fever_grid(tmp_path, shared_data, tiny_prompt_model)), timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "run"
    assert json.loads((run_dir / "generate" / "manifest.json").read_text())["task"] == "fever"
    for fmt in ("standard", "react"):
        rows = read_records(run_dir / "sft" / fmt / "train.jsonl")
        assert rows and all(r["prompt"].startswith("Claim: ") for r in rows)
        final = json.loads((tmp_path / "ckpt" / "fever" / "tiny" / fmt / "final" / "manifest.json").read_text())
        assert (final["task"], final["prompt_format"], final["steps"]) == ("fever", "Claim: {question}\n", 2)
        card = (tmp_path / "ckpt" / "fever" / "tiny" / fmt / "final" / "README.md").read_text()
        assert "trajectories (FEVER)" in card and "`Claim: <claim>\\n`" in card
        [row] = json.loads((run_dir / "eval" / f"tiny-ft-{fmt}" / "summary.json").read_text())
        assert (row["task"], row["mode"], row["n"]) == ("fever", "finetune", 3)
        records = read_records(run_dir / "eval" / f"tiny-ft-{fmt}" / f"{fmt}.jsonl")
        assert all(r["text"].startswith("Claim: ") for r in records)  # zero-shot: the claim line alone
    prompted = json.loads((run_dir / "eval" / "tiny-prompt" / "manifest.json").read_text())
    assert prompted["task"] == "fever" and prompted["config"]["prompting"]["exemplars"] == "paper"
    md = (run_dir / "plot" / "results.md").read_text()
    assert md.startswith("# FEVER accuracy (%) by model size: offline-eval")
    assert "| paper | PaLM-540B (ReAct paper) | prompt | CoT-SC→ReAct | 64.6 |" in md
    assert (run_dir / "plot" / "figure3.png").stat().st_size > 0
    # round 2: round 1's student samples FEVER claims, scored by accuracy; filter (data: union) keeps
    # round 1's rows and any new right ones; the round-2 student trains and is evaluated on FEVER
    round2 = run_dir / "rounds" / "tiny-react" / "round-2"
    generated = json.loads((round2 / "generate" / "manifest.json").read_text())
    assert generated["task"] == "fever" and generated["teacher"] == "tiny round 1 (react)"
    records = read_records(round2 / "generate" / "react.jsonl")
    assert len(records) == 4 * 2 and all(r["text"].startswith("Claim: ") for r in records)
    assert all(r["em"] == FEVER.score(r["prediction"], r["gold_answer"]) for r in records)
    assert json.loads((round2 / "sft" / "react" / "manifest.json").read_text())["task"] == "fever"
    rows = read_records(round2 / "sft" / "react" / "train.jsonl")
    assert rows and all(r["prompt"].startswith("Claim: ") for r in rows)
    final = json.loads((tmp_path / "ckpt" / "fever" / "tiny" / "react-round2" / "final" / "manifest.json").read_text())
    assert (final["task"], final["prompt_format"]) == ("fever", "Claim: {question}\n")
    [row] = json.loads((run_dir / "eval" / "tiny-ft-react-round2" / "summary.json").read_text())
    assert (row["task"], row["mode"], row["n"]) == ("fever", "finetune", 3)
    assert (run_dir / "plot" / "rounds.md").read_text().startswith("# Self-training rounds: FEVER accuracy (%) by round")
    print(f"FEVER grid: {time.monotonic() - started:.0f} s")

