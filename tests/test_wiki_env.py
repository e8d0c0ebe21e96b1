"""WikiEnv's observation text (the paper's), through a real LocalIndex built from a few pages.

    .venv/bin/python -m pytest tests/test_wiki_env.py -q
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from pipeline.tasks import get_task
from pipeline.wiki.env import WikiEnv
from pipeline.wiki.index import LocalIndex, build_index

SHARED_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wiki" / "corpus.jsonl"

MILHOUSE = [
    "Milhouse Mussolini Van Houten is a fictional character in The Simpsons.",
    " He is voiced by Pamela Hayden.",
    " Milhouse is Bart Simpson's best friend.",
    " He was named after U.S. president Richard Nixon, whose middle name was Milhous.",
    " He first appeared in 1988.",
    " The writers liked the name.",
    " Nixon was unpopular with the writers.",
]
PAGES = [
    {"title": "Milhouse Van Houten", "sentences": MILHOUSE},
    {"title": "Adam Clayton Powell", "sentences": ["Adam Clayton Powell may refer to:", "Adam Clayton Powell Sr. (1865–1953)",
                                                   "Adam Clayton Powell Jr. (1908–1972)"]},
    {"title": "Adam Clayton Powell Jr.", "sentences": ["Adam Clayton Powell Jr. was an American politician."]},
    {"title": "Adam Clayton Powell Sr.", "sentences": ["Adam Clayton Powell Sr. was an American pastor."]},
    {"title": "Adam [film]", "sentences": ["Adam is a film with brackets in its title."]},
    {"title": "Houten", "sentences": ["Houten is a municipality in the Netherlands."]},
    {"title": "東京都", "sentences": ["東京都は日本の首都である。", "人口は約1400万人。"]},
    {"title": "Москва", "sentences": ["Москва — столица России.", "Город основан в 1147 году."]},
]


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> LocalIndex:
    folder = tmp_path_factory.mktemp("wiki")
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in PAGES), encoding="utf-8")
    with LocalIndex(build_index([corpus], folder / "wiki.sqlite").out) as built:
        yield built


@pytest.fixture
def env(index) -> WikiEnv:
    env = WikiEnv(index, score=get_task("hotpotqa").scores)
    env.reset("Who was Milhouse named after?", "Richard Nixon")
    return env


def similar_of(observation: str, shown: str) -> list[str]:
    prefix = f"Could not find {shown}. Similar: "
    assert observation.startswith(prefix) and observation.endswith(".")
    return ast.literal_eval(observation[len(prefix):-1])


def test_search_hit_shows_first_five_sentences(env):
    observation, reward, done, info = env.step("Search[Milhouse Van Houten]")
    assert observation == (
        "Milhouse Mussolini Van Houten is a fictional character in The Simpsons. He is voiced by "
        "Pamela Hayden. Milhouse is Bart Simpson's best friend. He was named after U.S. president "
        "Richard Nixon, whose middle name was Milhous. He first appeared in 1988."
    )
    assert (reward, done, info["steps"], info["answer"]) == (0.0, False, 1, None)


def test_search_miss_lists_similar_titles_as_a_python_list(env):
    observation, _, done, _ = env.step("Search[Van Houten family]")
    # BM25: two query words in the title and one in the text beat one in the title
    assert observation == "Could not find Van Houten family. Similar: ['Milhouse Van Houten', 'Houten']."
    assert not done
    observation, *_ = env.step("Search[Zyzzyva]")
    assert observation == "Could not find Zyzzyva. Similar: []."


def test_disambiguation_page_is_a_miss_on_bracketed_entity(env):
    observation, *_ = env.step("Search[Adam Clayton Powell]")
    similar = similar_of(observation, "[Adam Clayton Powell]")
    assert set(similar[:3]) == {"Adam Clayton Powell", "Adam Clayton Powell Jr.", "Adam Clayton Powell Sr."}
    assert similar[3:] == ["Adam [film]"]  # one word in common ranks below three
    observation, *_ = env.step("Lookup[Powell]")
    assert observation == "No more results."  # a disambiguation page is not loaded


def test_lookup_walks_matches_restarts_and_runs_out(env):
    env.step("Search[Milhouse Van Houten]")
    assert env.step("Lookup[Nixon]")[0] == (
        "(Result 1 / 2) He was named after U.S. president Richard Nixon, whose middle name was Milhous.")
    assert env.step("Lookup[Nixon]")[0] == "(Result 2 / 2) Nixon was unpopular with the writers."
    assert env.step("Lookup[Nixon]")[0] == "No more results."
    assert env.step("Lookup[writers]")[0] == "(Result 1 / 2) The writers liked the name."  # new keyword
    assert env.step("Lookup[NIXON]")[0].startswith("(Result 1 / 2) He was named")  # case-insensitive


def test_search_resets_lookup(index):
    env = WikiEnv(index, max_steps=20)
    env.reset("q")
    env.step("Search[Milhouse Van Houten]")
    assert env.step("Lookup[Nixon]")[0].startswith("(Result 1 / 2)")
    env.step("Search[Milhouse Van Houten]")
    assert env.step("Lookup[Nixon]")[0].startswith("(Result 1 / 2)")
    env.step("Search[Nothing Here At All]")
    assert env.step("Lookup[Nixon]")[0] == "No more results."  # a miss unloads the page


def test_lookup_without_a_page(env):
    assert env.step("Lookup[anything]")[0] == "No more results."
    assert env.step("Lookup[]")[0] == "No more results."


def test_finish_scores_and_ends(env):
    observation, reward, done, info = env.step("Finish[richard nixon]")
    assert (observation, reward, done) == ("Episode finished, reward = 1", 1.0, True)
    assert info == {"steps": 1, "answer": "richard nixon", "em": 1.0, "f1": 1.0, "finished": True}
    assert env.step("Search[Milhouse]")[0] == "Episode already finished."


def test_wrong_finish_scores_zero_with_partial_f1(index):
    env = WikiEnv(index, score=get_task("hotpotqa").scores)
    env.reset("q", "Richard Nixon")
    env.step("Search[Houten]")
    observation, reward, done, info = env.step("Finish[Nixon]")
    assert (observation, reward, done) == ("Episode finished, reward = 0", 0.0, True)
    assert info["em"] == 0.0 and info["f1"] == pytest.approx(2 / 3) and info["steps"] == 2


@pytest.mark.parametrize("action", ["Jump[Milhouse]", "Search Milhouse", "Search[Milhouse", "", "Thought: hmm"])
def test_invalid_actions(env, action):
    observation, reward, done, info = env.step(action)
    assert observation == f"Invalid action: {action}"
    assert (reward, done, info["steps"]) == (0.0, False, 1)


def test_step_limit_ends_the_episode_unanswered(index):
    env = WikiEnv(index, max_steps=3, score=get_task("hotpotqa").scores)
    env.reset("q", "x")
    assert env.step("Search[Houten]")[2] is False
    assert env.step("Lookup[Netherlands]")[2] is False
    observation, reward, done, info = env.step("Lookup[Netherlands]")
    assert observation == "No more results." and done and reward == 0.0
    assert info["finished"] is False and info["answer"] is None and info["steps"] == 3


@pytest.mark.parametrize("action", [
    "search[Milhouse Van Houten]", "SEARCH[milhouse van houten]", "  Search [  Milhouse   Van Houten ]  ",
    "Search[milhouse_van_houten]", "Search[ＭＩＬＨＯＵＳＥ Van Houten]",
])
def test_odd_case_spacing_and_forms_still_hit(env, action):
    assert env.step(action)[0].startswith("Milhouse Mussolini Van Houten is a fictional character")


def test_nested_brackets_reach_the_backend(env):
    assert env.step("Search[Adam [film]]")[0] == "Adam is a film with brackets in its title."


def test_empty_and_huge_searches(env):
    assert env.step("Search[]")[0] == "Could not find . Similar: []."
    assert env.step("Search[   ]")[0] == "Could not find . Similar: []."
    observation, _, done, _ = env.step("Search[" + "Milhouse " * 1200 + "]")
    assert observation.startswith("Could not find Milhouse Milhouse") and len(observation) < 1000 and not done


@pytest.mark.parametrize("query", [
    '"Houten', "Houten AND OR", "NEAR(Houten, 2)", "Houten*", "(Houten)", "title:Houten", "-Houten",
    "^Houten", "{title}: Houten", "Houten \"\" ''",
])
def test_fts5_syntax_is_plain_words(env, query):
    observation, *_ = env.step(f"Search[{query}]")
    similar = similar_of(observation, query)
    assert similar[0] in {"Houten", "Milhouse Van Houten"}


def test_non_latin_pages_and_queries(env):
    assert env.step("Search[東京都]")[0] == "東京都は日本の首都である。 人口は約1400万人。"
    assert env.step("Search[москва]")[0] == "Москва — столица России. Город основан в 1147 году."
    assert similar_of(env.step("Search[Москва город]")[0], "Москва город") == ["Москва"]
    assert similar_of(env.step("Search[القاهرة]")[0], "القاهرة") == []


# ---------------------------------------------------------------- the real offline corpus


@pytest.fixture(scope="session")
def shared_index(tmp_path_factory) -> LocalIndex:
    if not SHARED_CORPUS.exists():
        pytest.skip(f"{SHARED_CORPUS} is absent")
    out = tmp_path_factory.mktemp("shared-wiki") / "wiki.sqlite"
    with LocalIndex(build_index([SHARED_CORPUS], out).out) as built:
        yield built


def shared_pages(n: int) -> list[dict]:
    pages = []
    with open(SHARED_CORPUS, encoding="utf-8") as fh:
        for line in fh:
            pages.append(json.loads(line))
            if len(pages) == n:
                return pages
    return pages


def test_shared_corpus_hits_show_its_first_five_sentences(shared_index):
    assert shared_index.page_count == sum(1 for _ in open(SHARED_CORPUS, encoding="utf-8"))
    env = WikiEnv(shared_index, max_steps=100)
    env.reset("q")
    for page in shared_pages(200)[::20]:
        expected = " ".join(s.strip() for s in page["sentences"][:5])
        assert env.step(f"Search[{page['title']}]")[0] == expected
        assert env.step(f"Search[{page['title'].lower()}]")[0] == expected


def test_shared_corpus_known_page_lookup_and_miss(shared_index):
    env = WikiEnv(shared_index)
    env.reset("q")
    observation, *_ = env.step("Search[Socialist Revolutionary Party]")
    assert observation.startswith("The Socialist Revolutionary Party, or Party of Socialists-Revolutionaries")
    assert env.step("Lookup[Bolshevik]")[0].startswith("(Result 1 / 3) In November 1917, it won a plurality")
    assert env.step("Lookup[Bolshevik]")[0].startswith("(Result 2 / 3) The SRs soon split into pro-Bolshevik")
    similar = similar_of(env.step("Search[Socialist Revolutionary]")[0], "Socialist Revolutionary")
    assert len(similar) == 5 and "Socialist Revolutionary Party" in similar
