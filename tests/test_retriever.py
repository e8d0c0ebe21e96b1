"""The bm25 search mode (wiki.search=bm25, a retriever beside the paper's exact-title search):
the index's ranking, the environment's observation and Lookup, the settings carried to every
WikiEnv, the stand-in teacher's queries, the mode's exemplars, RAG, the mode's lineage from
generate through filter to a student, and the refusals (one line, exit 2, nothing written).
All over the real 26k-page index (the session's `index` fixture).

    .venv/bin/python -m pytest tests/test_retriever.py -q
"""

from __future__ import annotations

import json
import pickle
import re

import pytest
from episode_testdata import CORPUS, run_pipeline

from pipeline.core.errors import PipelineError
from pipeline.llm.base import Completion
from pipeline.methods import MethodSettings, build_method
from pipeline.methods.base import EpisodeContext
from pipeline.tasks import get_task
from pipeline.wiki.config import WikiConfig, open_backend, search_of
from pipeline.wiki.env import WikiEnv
from pipeline.wiki.index import LocalIndex, title_key

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")
HOTPOTQA = get_task("hotpotqa")


@pytest.fixture(scope="module")
def wiki(index):
    with LocalIndex(index) as backend:
        yield backend


@pytest.fixture(scope="module")
def questions():
    return HOTPOTQA.load_questions("offline-eval", limit=12)


def test_retrieve_ranks_a_gold_page_first_for_the_question_itself(wiki, questions):
    q = questions[0]  # "... the magazine that called Ohio State Route 78 one of the most scenic highways ..."
    pages = wiki.retrieve(q.question, 3)
    assert [p.title for p in pages][0] == "Ohio State Route 78" and len(pages) == 3
    hits = sum(bool(gold & {title_key(p.title) for p in wiki.retrieve(x.question, 3)})
               for x in questions for gold in [{title_key(t) for t, _ in x.supporting_facts}])
    assert hits >= 10, hits  # 93.6% of all 500 (docs/environment.md); 12 here
    assert wiki.retrieve("the of and which was", 3) == []  # stop words only: nothing to rank by
    assert len(wiki.retrieve(q.question, 1)) == 1 and wiki.retrieve(q.question, 0) == []


def test_a_bm25_search_shows_k_titled_pages_in_one_observation_and_lookup_walks_them(wiki, questions):
    q = questions[0]
    env = WikiEnv(wiki, search="bm25", search_k=2)
    env.reset(q.question)
    observation, _, _, _ = env.step(f"Search[{q.question}]")
    assert observation.startswith("(1) Ohio State Route 78: State Route 78 (SR 78) is a state highway")
    assert len(re.findall(r"\(\d\) [^:]+: ", observation)) == 2 and "(3) " not in observation
    assert "\n" not in observation
    env.step("Search[Car and Driver]")
    assert env.step("Lookup[circulation]")[0] == "(Result 1 / 1) Its total circulation is 1.23 million."
    assert env.step("Lookup[circulation]")[0] == "No more results."
    assert env.step("Search[the of and]")[0] == "Could not find the of and."
    title = WikiEnv(wiki)  # the paper's mode is unchanged: a question is no page title
    title.reset(q.question)
    assert title.step(f"Search[{q.question}]")[0].startswith(f"Could not find {q.question}. Similar: [")


def test_the_config_puts_the_mode_on_the_backend_and_it_survives_a_worker_process(index):
    backend = open_backend(WikiConfig(index=index, corpus=[str(CORPUS)], search="bm25", search_k=4))
    copy = pickle.loads(pickle.dumps(backend))  # what a worker process gets
    for b in (backend, copy):
        env = WikiEnv(b)
        assert (env.search_mode, env.search_k) == ("bm25", 4)
    assert search_of({"config": {"wiki": {"search": "bm25"}}}) == "bm25" and search_of({}) == "title"


def test_the_stand_in_searches_what_a_student_could_write_never_a_title_it_could_not_know(wiki, questions):
    method = HOTPOTQA.oracle("react", MethodSettings(), "agent")
    finished = 0
    for q in questions:
        ctx = EpisodeContext(q, lambda: WikiEnv(wiki, search="bm25", score=HOTPOTQA.scores))
        program = method.run(ctx)
        with pytest.raises(StopIteration) as stop:
            next(program)
        outcome = stop.value.value
        read = q.question.casefold()
        for step in outcome.trajectory.steps:
            if step.action.startswith("Search["):
                query = step.action[len("Search["):-1]
                assert query == q.question or query.casefold() in read, (query, q.question)
            read += " " + (step.observation or "").casefold()
        if outcome.end_reason == "finish":
            finished += 1
            assert outcome.prediction == q.answer
        else:
            assert outcome.end_reason.startswith("oracle_not_retrieved: "), outcome.end_reason
    assert finished >= 8, finished  # 404 of all 500


def test_the_modes_exemplars_match_a_replay_and_keep_the_papers_thoughts_and_actions(wiki):
    from pipeline.core.paths import resolve_source
    from pipeline.methods.build_exemplars import check
    from pipeline.methods.prompts import exemplar_dir, load_prompt

    assert check(wiki, exemplar_dir(HOTPOTQA, "bm25"), search="bm25") == []
    replayed = load_prompt("react", "paper", HOTPOTQA, "bm25")
    assert replayed.source.endswith("exemplars/bm25/paper.json#webthink_simple6")
    original = json.loads(resolve_source(HOTPOTQA.paper_prompts).read_text(encoding="utf-8"))["webthink_simple6"]

    def kept(text):
        return [line for line in text.splitlines() if not line.startswith("Observation ")]

    assert kept(replayed.exemplars.rstrip("\n")) == kept(original.rstrip("\n"))
    assert replayed.exemplars != original.rstrip("\n") + "\n"
    assert "Observation 1: (1) " in replayed.exemplars  # the retriever's pages, titled
    assert load_prompt("react", "ours", HOTPOTQA, "bm25").source.endswith("exemplars/bm25")


def test_rag_retrieves_once_with_the_question_then_answers(wiki, questions):
    q = questions[0]
    method = build_method("rag", MethodSettings(), HOTPOTQA, "bm25")
    program = method.run(EpisodeContext(q, lambda: WikiEnv(wiki, search="bm25", search_k=3, score=HOTPOTQA.scores)))
    [request] = next(program)
    context = request.prompt.rsplit("Context: ", 1)[1]
    assert context.startswith("(1) Ohio State Route 78: ") and context.endswith(f"Question: {q.question}\nAnswer:")
    with pytest.raises(StopIteration) as stop:
        program.send([[Completion(" Car and Driver")]])
    outcome = stop.value.value
    assert (outcome.prediction, outcome.end_reason) == ("Car and Driver", "finish")
    assert [s.action for s in outcome.trajectory.steps] == [f"Search[{q.question}]"]


def test_generate_filter_and_the_dataset_carry_the_mode(index, tmp_path):
    from pipeline.core.config import build
    from pipeline.core.messages import tool_schemas
    from pipeline.stages.filter import FilterConfig, run_filter
    from pipeline.stages.generate import GenerateConfig, generate
    from pipeline.train.data import dataset_search

    wiki = {"index": str(index), "search": "bm25"}
    gen = build(GenerateConfig, {"oracle": "agent", "methods": ["react"], "questions": "offline-bootstrap",
                                 "limit": 6, "wiki": wiki, "out_dir": str(tmp_path / "gen")})
    stats = generate(gen)
    manifest = json.loads((tmp_path / "gen" / "manifest.json").read_text())
    assert manifest["search"] == "bm25" and stats["react"]["em"] > 0
    assert all("Observation 1: (1) " in r["text"] for r in map(json.loads, (tmp_path / "gen" / "react.jsonl").open())
               if r["em"] == 1.0)
    run_filter(build(FilterConfig, {"inputs": [str(tmp_path / "gen")], "out_dir": str(tmp_path / "sft")}))
    assert dataset_search(tmp_path / "sft" / "react" / "train.jsonl") == "bm25"
    # the messages layout's search tool is the one these trajectories searched with, as the tool-calling loop's
    chats = [json.loads(line) for line in (tmp_path / "sft" / "react" / "messages.jsonl").open()]
    assert chats and all(chat["tools"] == tool_schemas(search="bm25") for chat in chats)


def test_a_student_of_one_mode_is_refused_in_the_other_and_labelled_when_allowed(tmp_path, index):
    """The refusal comes from the student's final/manifest.json, before any model is read (the
    manifest is written here by hand, a stand-in for a `train` output's)."""
    from pipeline.stages.eval import ModelUnderTest, summary_row

    final = tmp_path / "final"
    final.mkdir()
    (final / "manifest.json").write_text(json.dumps({
        "stage": "train", "complete": True, "format": "react", "student": "tiny", "size_class": "135m",
        "params_b": 0.135, "search": "title"}))
    out = tmp_path / "never"
    proc = run_pipeline("eval", f"finetuned={final}", "wiki.search=bm25", f"wiki.index={index}", f"out_dir={out}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: {final} was trained on wiki.search=title observations; evaluating it with wiki.search=bm25")
    assert not out.exists()
    target = ModelUnderTest(None, "tiny (fine-tuned)", "finetune", "135m", 0.135, "react", trained_search="title")
    row = summary_row(target, "react", "offline-eval", {}, {}, search="bm25")
    assert (row["search"], row["trained_search"]) == ("bm25", "title")


def test_a_grid_whose_students_train_in_one_mode_and_are_evaluated_in_the_other_is_refused_at_plan_time(tmp_path):
    base = ("run", "--config", "configs/small-figure3.yaml", "--print-config", f"out_dir={tmp_path}/grid",
            "wiki.search=bm25", "generate.oracle=agent")
    proc = run_pipeline(*base, "eval.wiki.search=title")
    assert proc.returncode == 2, proc.stderr
    assert "trained on wiki.search=bm25 observations and evaluated with wiki.search=title" in proc.stderr
    assert not (tmp_path / "grid").exists()
    allowed = run_pipeline(*base, "eval.wiki.search=title", "eval.allow_search_mismatch=true")
    assert allowed.returncode == 0, allowed.stderr


def test_the_floor_grid_plans_act_react_and_rag_in_the_retriever_mode_with_both_exemplar_sets(tmp_path, monkeypatch,
                                                                                              smollm2_dir):
    """configs/small-retriever-floor.yaml, planned as `run` plans it, and its rehearsal's plan
    (--rehearse keeps the grid's search mode where it replaces the index)."""
    from episode_testdata import REPO

    from pipeline.core.config import build, load_config
    from pipeline.rehearsal.rewrite import rehearse
    from pipeline.stages.eval import EvalConfig
    from pipeline.stages.generate import GenerateConfig
    from pipeline.stages.grid.plan import plan
    from pipeline.stages.grid.spec import RunConfig, Student

    monkeypatch.chdir(REPO)
    cfg = load_config(RunConfig, REPO / "configs/small-retriever-floor.yaml",
                      [f"out_dir={tmp_path}/grid", f"wiki.index={tmp_path}/not-here.sqlite"])
    students = [build(Student, s, where="students") for s in cfg.students]
    evals = [u.config for u in plan(cfg, students) if isinstance(u.config, EvalConfig)]
    assert len(evals) == 4 and all(e.finetuned is None for e in evals)
    assert all((e.wiki.search, e.wiki.search_k, e.methods, e.questions, e.limit) ==
               ("bm25", 3, ["act", "react", "rag"], "offline-eval", None) for e in evals)
    assert sorted(e.prompting.exemplars for e in evals) == ["ours", "ours", "paper", "paper"]
    rehearsal = rehearse(cfg, students)
    assert rehearsal.config.wiki["index"] != f"{tmp_path}/not-here.sqlite"  # the local corpus stands in
    units = plan(rehearsal.config, rehearsal.students)
    assert {u.config.wiki.search for u in units if isinstance(u.config, EvalConfig | GenerateConfig)} == {"bm25"}


def test_plot_refuses_both_modes_in_one_figure():
    from pipeline.report.summaries import check_search_modes

    assert check_search_modes([{"search": "bm25", "origin": "a"}, {"search": "bm25", "origin": "b"}]) == "bm25 search"
    with pytest.raises(PipelineError, match=r"different wiki.search modes in one figure \(bm25 e.g. a; title e.g. b\)"):
        check_search_modes([{"search": "bm25", "origin": "a"}, {"origin": "b"}])


def test_generate_looks_its_task_up_by_name_once_and_prompts_with_the_modes_exemplars(index, tmp_path, monkeypatch):
    """A prompted teacher (a scripted one behind a real HTTP endpoint) in the retriever mode:
    the stage resolves its task once at its entrance and hands it down (before, its config named
    the task to five look-ups on the way through answerers, the run folder and the shards), and
    the prompts carry the mode's exemplars (their observations are the retriever's)."""
    from episode_testdata import ScriptedTeacher
    from http_servers import FakeOpenAI

    import pipeline.agent.answerers
    import pipeline.stages.generate
    import pipeline.tasks
    from pipeline.core.config import build
    from pipeline.stages.generate import GenerateConfig, generate
    from pipeline.tasks import Task

    lookups = []
    real = pipeline.tasks.get_task

    def counting(name=None):
        if not isinstance(name, Task):
            lookups.append(name)
        return real(name)

    for module in (pipeline.tasks, pipeline.stages.generate, pipeline.agent.answerers):
        monkeypatch.setattr(module, "get_task", counting)
    questions = real("hotpotqa").load_questions("offline-bootstrap", limit=2)
    with FakeOpenAI(model="scripted-teacher") as server:
        server.replies = ScriptedTeacher(questions)
        cfg = build(GenerateConfig, {
            "teacher": {"backend": "openai", "model": "scripted-teacher", "base_url": f"{server.url}/v1"},
            "methods": ["react"], "questions": "offline-bootstrap", "limit": 2, "out_dir": str(tmp_path / "gen"),
            "wiki": {"index": str(index), "search": "bm25"}})
        generate(cfg)
        prompts = list(server.replies.prompts)
    assert lookups == ["hotpotqa"], lookups
    assert prompts and all("Observation 1: (1) " in p for p in prompts)  # the bm25 exemplars
    manifest = json.loads((tmp_path / "gen" / "manifest.json").read_text())
    assert manifest["exemplar_sources"]["react"]["react"].endswith("exemplars/bm25")
