"""`observation_style: original`: wikienv.py's rules, each checked on text worked out by hand
from the original code (ysymyth/ReAct wikienv.py, quoted in the comments), against the clean style.

    .venv/bin/python -m pytest tests/test_wiki_original_style.py -q
"""

from __future__ import annotations

import json

import pytest
from episode_testdata import build_small_index

from pipeline.core.errors import PipelineError
from pipeline.tasks import get_task
from pipeline.wiki.actions import parse_action_original
from pipeline.wiki.config import WikiConfig, open_backend
from pipeline.wiki.env import WikiEnv
from pipeline.wiki.index import LocalIndex

PAGES = [
    # the full dump's shape: paragraphs of sentences, the first paragraph the title
    {"title": "Colorado orogeny", "text": [
        ["Colorado orogeny"],
        ["The Colorado orogeny was an episode of mountain building.", " It took place in Colorado."],
        ["Short one"],  # a paragraph of <= 2 words: the original drops it from the page text
        ["The eastern sector is in the High Plains.", " The Cheyenne belt bounds it."],
    ]},
    {"title": "Milhouse Van Houten", "sentences": [
        "Milhouse Van Houten is a character.", " He was named after Richard Nixon.",
        " Nixon's middle name was Milhous."]},
    {"title": "Mercury", "text": [
        ["Mercury is a word with many uses.", " It is common.", " It is old."],
        ["Mercury may refer to:", " Mercury (planet)", " Mercury (element)"]]},
]


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    with LocalIndex(build_small_index(tmp_path_factory.mktemp("wiki"), PAGES)) as built:
        yield built


def make_env(index, style: str) -> WikiEnv:
    env = WikiEnv(index, style=style, score=get_task("hotpotqa").scores)
    env.reset("q", "Richard Nixon")
    return env


def test_sentences_split_on_period_space_with_dots_doubled_at_paragraph_ends(index):
    # get_page_obs: p.split('. ') per paragraph, then s.strip() + '.': "Colorado." -> "Colorado.."
    obs, *_ = make_env(index, "original").step("search[Colorado orogeny]")
    assert obs == ("The Colorado orogeny was an episode of mountain building. It took place in "
                   "Colorado.. The eastern sector is in the High Plains. The Cheyenne belt bounds it..")
    clean, *_ = make_env(index, "clean").step("Search[Colorado orogeny]")
    assert clean == ("The Colorado orogeny was an episode of mountain building. It took place in "
                     "Colorado. Short one The eastern sector is in the High Plains. The Cheyenne belt bounds it.")


def test_a_miss_keeps_the_previous_page_and_lookup_state(index):
    env = make_env(index, "original")
    env.step("search[Milhouse Van Houten]")
    assert env.step("lookup[Nixon]")[0] == "(Result 1 / 2) He was named after Richard Nixon."
    assert env.step("search[Nowhere at all]")[0].startswith("Could not find Nowhere at all. Similar: ")
    # the original's search_step leaves self.page / lookup_* alone on a miss
    assert env.step("lookup[Nixon]")[0] == "(Result 2 / 2) Nixon's middle name was Milhous.."
    assert env.step("lookup[Nixon]")[0] == "No more results.\n"
    # only a hit resets the lookup state
    env.step("search[Milhouse Van Houten]")
    assert env.step("lookup[Nixon]")[0] == "(Result 1 / 2) He was named after Richard Nixon."


def test_the_clean_style_forgets_the_page_on_a_miss(index):
    env = make_env(index, "clean")
    env.step("Search[Milhouse Van Houten]")
    env.step("Lookup[Nixon]")
    env.step("Search[Nowhere at all]")
    assert env.step("Lookup[Nixon]")[0] == "No more results."


def test_disambiguation_is_detected_in_any_paragraph(index):
    obs, *_ = make_env(index, "original").step("search[Mercury]")
    assert obs.startswith("Could not find [Mercury]. Similar: ")
    clean, *_ = make_env(index, "clean").step("Search[Mercury]")  # the mark is not in its lead
    assert clean.startswith("Mercury is a word with many uses.")


def test_the_strict_parser_accepts_exactly_what_wikienv_step_accepts():
    assert parse_action_original("search[Milhouse]").argument == "Milhouse"
    assert parse_action_original("  lookup[ named after ] \n").argument == " named after "  # unstripped
    assert parse_action_original("finish[]").argument == ""
    assert parse_action_original("search[Adam [film]]").argument == "Adam [film]"
    assert parse_action_original("think[hmm]").name == "think"
    for bad in ("Search[Milhouse]", "SEARCH[x]", "search [x]", "search[x] and more", "search(x)", ""):
        assert parse_action_original(bad) is None, bad


def test_original_step_texts(index):
    env = make_env(index, "original")
    assert env.step("Search[Milhouse Van Houten]")[0] == "Invalid action: Search[Milhouse Van Houten]"
    assert env.step("think[plan]")[0] == "Nice thought."
    assert env.step("lookup[]")[0] == "No more results.\n"  # no page yet: construct_lookup_list -> []
    obs, reward, done, info = env.step("finish[Richard Nixon]")
    assert (obs, reward, done, info["answer"]) == ("Episode finished, reward = 1\n", 1.0, True, "Richard Nixon")


def test_the_config_carries_the_style_to_every_env(index, tmp_path):
    cfg = WikiConfig(index=index.path, corpus=[], observation_style="original")
    backend = open_backend(cfg)
    assert WikiEnv(backend).style == "original"
    with pytest.raises(PipelineError, match="observation_style"):
        open_backend(WikiConfig(index=index.path, corpus=[], observation_style="pretty"))


def test_wiki_step_takes_the_style(index):
    from episode_testdata import run_pipeline

    proc = run_pipeline("wiki", "step", "--index", str(index.path), "--style", "original",
                        "search[Milhouse Van Houten]", "lookup[Nixon]")
    assert proc.returncode == 0, proc.stderr
    first, second = (json.loads(line) for line in proc.stdout.splitlines())
    assert first["observation"].endswith("Milhous..") and second["observation"].startswith("(Result 1 / 2)")
