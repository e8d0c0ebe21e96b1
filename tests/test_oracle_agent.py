"""The oracle teacher's two search styles (a stand-in, not the paper's teacher) over the REAL local
index built from the shared corpus and a sample of the offline bootstrap split:

- `agent` searches names as the question writes them, misses, recovers through the `Similar:`
  list or the full title, looks up what a search did not show, and is still always correct;
- `exact` (the default) writes the same records as before the agent style existed;
- both are deterministic.

    .venv/bin/python -m pytest tests/test_oracle_agent.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from episode_testdata import run_pipeline

from pipeline.agent.scheduler import run_episodes
from pipeline.agent.search_stats import search_stats
from pipeline.methods import MethodSettings
from pipeline.stages.filter import FilterConfig, select
from pipeline.tasks import get_task
from pipeline.tasks.hotpotqa.oracle import (
    TEACHER,
    name_span,
    oracle_method,
    search_query,
    similar_shown,
)
from pipeline.tasks.hotpotqa.questions import load_question_set
from pipeline.wiki.env import SENTENCES_SHOWN, WikiEnv
from pipeline.wiki.index import LocalIndex, title_key

EXACT_RECORDS = Path(__file__).parent / "oracle_exact_records.jsonl"  # written by the code before the agent style


@pytest.fixture(scope="module")
def wiki(index) -> LocalIndex:
    return LocalIndex(index)


@pytest.fixture(scope="module")
def sample(wiki):
    """80 bootstrap questions whose gold pages are all in the index (the split is shuffled, so
    the first ones are a random sample), plus two whose supporting sentence lies beyond the
    sentences a search shows (they need a Lookup)."""
    pool = [q for q in load_question_set("offline-bootstrap")[:400]
            if all(wiki.get_page(t) is not None for t in q.gold_titles)]
    deep = [q for q in pool[80:] if any(i is not None and i >= SENTENCES_SHOWN for _, i in q.supporting_facts)]
    return pool[:80] + deep[:2]


def run(wiki, questions, fmt, style, **settings):
    records = run_episodes(None, lambda: wiki, questions, oracle_method(fmt, MethodSettings(**settings), style),
                           teacher=TEACHER)
    for r in records:
        r.pop("seconds")
    return records


@pytest.fixture(scope="module")
def agent(wiki, sample):
    return {fmt: run(wiki, sample, fmt, "agent") for fmt in ("react", "act")}


def test_agent_episodes_are_all_correct_and_pass_the_filter(agent, sample):
    for fmt, records in agent.items():
        assert [r["id"] for r in records] == [q.id for q in sample]
        for r in records:
            assert (r["teacher"], r["end_reason"], r["finished"], r["em"]) == ("oracle", "finish", True, 1.0), r["text"]
            assert r["steps"][-1]["observation"] == "Episode finished, reward = 1"
        selection = select(fmt, records, FilterConfig())
        assert len(selection.kept) == len(records) and not any(selection.dropped.values())


def test_agent_episodes_miss_recover_and_look_up(agent):
    for records in agent.values():
        stats = search_stats(records)
        assert stats["miss_episodes"] >= 10  # about 30% of the split's episodes miss
        assert stats["recovered_episodes"] == stats["miss_episodes"]
        assert stats["lookup_episodes"] >= 2  # the deep questions
        assert stats["search_hit_rate"] < 1.0


def test_every_miss_is_followed_by_the_gold_title_grounded_in_the_observation(agent, sample, wiki):
    by_id = {q.id: q for q in sample}
    from_similar = 0
    for fmt, records in agent.items():
        for r in records:
            q, steps = by_id[r["id"]], r["steps"]
            gold = {title_key(t) for t in q.gold_titles}
            for step, after in zip(steps, steps[1:], strict=False):
                if not step["observation"].startswith("Could not find"):
                    continue
                assert after["action"].startswith("Search["), r["text"]
                title = after["action"][len("Search["):-1]
                assert title_key(title) in gold and not after["observation"].startswith("Could not find")
                if title in similar_shown(step["observation"]):
                    from_similar += 1
                    if fmt == "react":
                        assert "similar titles" in after["thought"] and title in after["thought"], after
                elif fmt == "react":
                    assert title in after["thought"], after
            # Every page the question names is searched first as the question writes it.
            for title in q.gold_titles:
                span = name_span(title, q.question)
                searches = [s["action"][len("Search["):-1] for s in steps if s["action"].startswith("Search[")]
                if span is not None and searches:
                    assert span in searches, (span, searches)
    assert from_similar >= 10


def test_agent_trajectories_replay_in_a_fresh_environment(agent, sample, wiki):
    by_id = {q.id: q for q in sample}
    for r in agent["react"][:30]:
        q = by_id[r["id"]]
        env = WikiEnv(wiki, score=get_task("hotpotqa").scores)
        env.reset(q.question, q.answer)
        assert [env.step(s["action"])[0] for s in r["steps"]] == [s["observation"] for s in r["steps"]]


def test_act_takes_the_react_actions_without_thoughts(agent):
    for react, act in zip(agent["react"], agent["act"], strict=True):
        assert [s["action"] for s in act["steps"]] == [s["action"] for s in react["steps"]]
        assert all(s["thought"] is None for s in act["steps"])
        assert all(s["thought"] for s in react["steps"])


def test_the_same_seed_gives_the_same_records_and_another_seed_the_same_actions(wiki, sample, agent):
    questions = sample[:40]
    again = run(wiki, questions, "react", "agent")
    assert again == agent["react"][:40]
    other = run(wiki, questions, "react", "agent", seed=1)
    assert [[s["action"] for s in r["steps"]] for r in other] == \
           [[s["action"] for s in r["steps"]] for r in again]
    assert all(r["em"] == 1.0 for r in other)


def test_a_tight_step_limit_drops_misses_not_correctness(wiki, sample):
    """With 3 steps a two-page question has no room for a miss: the agent style searches the
    exact titles then, and still finishes correctly."""
    two_pages = [q for q in sample if len(q.gold_titles) == 2][:20]
    records = run(wiki, two_pages, "react", "agent", max_steps=3)
    assert all(r["em"] == 1.0 and r["n_steps"] == 3 for r in records)
    assert search_stats(records)["miss_episodes"] == 0


def test_exact_style_writes_the_records_it_wrote_before(wiki):
    before = [json.loads(line) for line in EXACT_RECORDS.read_text(encoding="utf-8").splitlines()]
    questions = {q.id: q for q in load_question_set("offline-bootstrap")[:50]}
    for fmt in ("react", "act"):
        expected = [r for r in before if r["method"] == fmt]
        records = run(wiki, [questions[r["id"]] for r in expected], fmt, "exact")
        assert [{k: r[k] for k in expected[0]} for r in records] == expected
    default = run(wiki, [questions[before[0]["id"]]], "react", "exact")
    assert run_episodes(None, lambda: wiki, [questions[before[0]["id"]]], oracle_method("react"),
                        teacher=TEACHER)[0]["text"] == default[0]["text"]  # exact is the default


@pytest.mark.parametrize("title, question, span", [
    ("Adorable (band)", "Which band was formed first, Lit or Adorable?", "Adorable"),
    ("Arthur's Magazine", "Which magazine was started first Arthur's Magazine or First for Women?",
     "Arthur's Magazine"),
    ("Adele", "What is Adele's third album?", "Adele"),
    ("The Climb (2007 film)", "Who directed The Climb?", "The Climb"),
    ("2007 Georgia Bulldogs football team", "Which bowl did the Georgia Bulldogs football team win?",
     "Georgia Bulldogs football team"),
    ("DuSable High School", "This high school is named after whom?", None),  # no name-like word
    ("Laleli Mosque", "Where is Laleli?", None),  # 1 of 2 words: too little of the title
])
def test_name_span_rule(title, question, span):
    assert name_span(title, question) == span
    assert search_query(title, question) == (span or title)


def test_a_bridge_page_is_searched_as_an_earlier_observation_names_it():
    read = "It stars Charlie Plummer and Travis Fimmel."
    assert search_query("Charlie Plummer", "Lean on Pete stars the actor known for what role?", read) == "Charlie Plummer"
    assert search_query("Moskau (song)", "Which song?", 'Included is the follow-up "Moskau".') == "Moskau"


def test_similar_shown_reads_only_a_list_of_titles():
    assert similar_shown("Could not find X. Similar: ['A (band)', \"B's\"].") == ["A (band)", "B's"]
    assert similar_shown("Could not find X. Similar: [].") == []
    assert similar_shown("Could not find X. Similar: [__import__('os')].") == []
    assert similar_shown("X is a band.") == []


def test_generate_reports_misses_recoveries_and_lookups(index, tmp_path):
    out = tmp_path / "gen"
    proc = run_pipeline("generate", "oracle=agent", "methods=[react,cot]",
                        "limit=30", f"wiki.index={index}", f"out_dir={out}")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads((out / "manifest.json").read_text())["stats"]
    records = [json.loads(line) for line in (out / "react.jsonl").read_text().splitlines()]
    assert stats["react"]["search"] == search_stats(records)
    assert stats["react"]["search_correct"] == search_stats(r for r in records if r["em"] == 1.0)
    assert stats["react"]["search_correct"]["miss_episodes"] > 0
    assert "search" not in stats["cot"]
    assert "missed a search" in proc.stdout and "recovered" in proc.stdout


@pytest.mark.parametrize("overrides, message", [
    (["oracle=clever"], "oracle must be one of exact, agent"),
    (["teacher.oracle_style=agent"], "unknown key 'teacher.oracle_style'; it was removed"),
    (["teacher.oracle_style=agent"], "use oracle=agent"),
    (["teacher.backend=oracle"], "the oracle is a stand-in teacher, not a language-model backend: set `oracle: exact`"),
    (["oracle=agent", "teacher.model=Qwen/Qwen2.5-7B"], "teacher.model would not be read"),
])
def test_a_bad_oracle_style_exits_2_and_writes_nothing(index, tmp_path, overrides, message):
    out = tmp_path / "gen"
    proc = run_pipeline("generate", *overrides, "methods=[react]", "limit=2", f"wiki.index={index}", f"out_dir={out}")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not out.exists()


def test_recovery_thoughts_are_drawn_from_the_seeded_generator():
    from pipeline.tasks.hotpotqa.oracle import recovery_thought

    miss = "Could not find Lit. Similar: ['Lit (band)', 'Lit (album)']."
    thoughts = {recovery_thought("Lit", "Lit (band)", miss, False, random.Random(seed)) for seed in range(20)}
    assert len(thoughts) == 2 and all("Lit (band)" in t and "similar titles" in t for t in thoughts)


def as_written_before_the_oracle_key(manifest_path: Path, section: str, model: str | None = None) -> None:
    """Rewrite a real run's manifest as the code before the `oracle` key wrote it: the stand-in
    teacher was `<section>.backend: oracle` with `<section>.oracle_style`."""
    manifest = json.loads(manifest_path.read_text())
    config = manifest["config"]
    style = config.pop("oracle")
    config[section] |= {"backend": "oracle", "oracle_style": style} | ({"model": model} if model else {})
    manifest_path.write_text(json.dumps(manifest))


def test_a_run_folder_written_when_the_oracle_was_a_backend_resumes_and_skips(index, tmp_path):
    """A generate folder whose manifest says `teacher.backend: oracle`, `teacher.oracle_style: agent`
    (the old way) resumes under `oracle=agent` (a larger limit appends only the new questions), is
    skipped as done by `run`, and is refused under the other style, as a changed style always was."""
    from pipeline.core.config import load_config
    from pipeline.stages.generate import GenerateConfig
    from pipeline.stages.grid.children import unit_done

    out = tmp_path / "gen"
    args = ("generate", "methods=[react]", "questions=offline-bootstrap", f"wiki.index={index}", f"out_dir={out}")
    assert run_pipeline(*args, "oracle=agent", "limit=2").returncode == 0
    first = (out / "react.jsonl").read_bytes()
    as_written_before_the_oracle_key(out / "manifest.json", "teacher")
    assert json.loads((out / "manifest.json").read_text())["config"]["teacher"]["backend"] == "oracle"
    cfg = load_config(GenerateConfig, None, [*args[1:], "oracle=agent", "limit=2"])
    assert unit_done(cfg)
    assert not unit_done(load_config(GenerateConfig, None, [*args[1:], "oracle=exact", "limit=2"]))

    proc = run_pipeline(*args, "oracle=exact", "limit=3")
    assert proc.returncode == 2 and "holds a generate run with a different oracle" in proc.stderr, proc.stderr
    proc = run_pipeline(*args, "oracle=agent", "limit=3")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (out / "react.jsonl").read_text().splitlines()]
    assert (out / "react.jsonl").read_bytes().startswith(first) and len({r["id"] for r in records}) == 3
    assert json.loads((out / "manifest.json").read_text())["config"]["oracle"] == "agent"


def test_an_eval_folder_written_when_the_oracle_was_a_backend_resumes(index, tmp_path):
    """An eval of the stand-in teacher written as `model.backend: oracle` (with `model.model: oracle`,
    for its label) resumes under `oracle=exact`; its rows are still labelled `oracle`."""
    out = tmp_path / "ev"
    args = ("eval", "methods=[cot]", "questions=offline-eval", "size_class=540b", "params_b=540",
            f"wiki.index={index}", f"out_dir={out}")
    assert run_pipeline(*args, "oracle=exact", "limit=2").returncode == 0
    as_written_before_the_oracle_key(out / "manifest.json", "model", model="oracle")
    proc = run_pipeline(*args, "oracle=agent", "limit=3")
    assert proc.returncode == 2 and "holds a eval run with a different oracle" in proc.stderr, proc.stderr
    proc = run_pipeline(*args, "oracle=exact", "limit=3")
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads((out / "summary.json").read_text())
    assert (row["model"], row["n"]) == ("oracle", 3)
