"""The live Wikipedia backend against a fake MediaWiki API on 127.0.0.1 (never the internet).

    .venv/bin/python -m pytest tests/test_wiki_live.py -q
"""

from __future__ import annotations

import random

import pytest
from http_servers import FAULT_KINDS, FakeMediaWiki, Fault

from pipeline.core.errors import PipelineError
from pipeline.core.transport import JsonHttpClient, RequestFailed
from pipeline.tasks import get_task
from pipeline.wiki.backend import Page
from pipeline.wiki.env import WikiEnv
from pipeline.wiki.live import LiveWikipedia, split_sentences

PAGES = {
    "Colorado orogeny": (
        "The Colorado orogeny was an episode of mountain building (an orogeny) in Colorado and "
        "surrounding areas. This took place from 1780 to 1650 million years ago.\n"
        "\n\n== Description ==\n"
        "The eastern sector extends into the High Plains and is called the Central Plains "
        "orogeny. The boundary between the Colorado orogeny and the Wyoming craton is the "
        "Cheyenne belt.\n"
        "See also\n"
        "=== Later work ===\n"
        "Geologists dated the eastern sector again in 2004."
    ),
    "Milhouse Van Houten": (
        "Milhouse Mussolini Van Houten is a recurring character in the Fox animated television "
        "series The Simpsons. Milhouse was named after U.S. president Richard Nixon, whose "
        "middle name was Milhous."
    ),
    "Mercury": (
        "Mercury may refer to:\n"
        "Mercury (planet), the closest planet to the Sun\n"
        "Mercury (element), a chemical element"
    ),
    "Adam Clayton Powell III": "Adam Clayton Powell III is an American journalist and politician.",
    "Adam Clayton Powell (film)": (
        "Adam Clayton Powell is a 1989 American documentary film directed by Richard Kilberg."
    ),
    "Zürich": "Zürich is the largest city in Switzerland. It lies on Lake Zürich.",
    "東京都": "東京都は日本の首都である 東京 は 大きい. 人口は多い です.",
}
REDIRECTS = {"Milhouse": "Milhouse Van Houten", "Zurich": "Zürich"}


@pytest.fixture
def server():
    with FakeMediaWiki(PAGES, REDIRECTS) as s:
        yield s


def live(server, tmp_path, *, max_retries: int = 3, sleeps: list | None = None) -> LiveWikipedia:
    client = JsonHttpClient(timeout_s=0.25, max_retries=max_retries, backoff_base_s=0.01,
                            backoff_max_s=0.05, rng=random.Random(0),
                            sleep=sleeps.append if sleeps is not None else (lambda s: None))
    return LiveWikipedia(api_url=server.api_url, cache_path=tmp_path / "cache.sqlite",
                         client=client)


def test_split_sentences_follows_the_original_wikienv():
    text = ("First sentence here. Second one, U.S. style.\n\n== History ==\n"
            "Short line\nEnds without a period: list follows\n=== Sub ===\nLast bit. ")
    assert split_sentences(text) == [
        "First sentence here.", "Second one, U.S.", "style.",  # `p.split('. ')`, like the original
        "Ends without a period: list follows",  # no '.' added where the split removed none
    ]  # headings and paragraphs of <= 2 words ("Short line", "Last bit.") are dropped


def test_hit_returns_the_page_sentences_without_headings(server, tmp_path):
    page = live(server, tmp_path).get_page("Colorado orogeny")
    assert page == Page("Colorado orogeny", [
        "The Colorado orogeny was an episode of mountain building (an orogeny) in Colorado and "
        "surrounding areas.",
        "This took place from 1780 to 1650 million years ago.",
        "The eastern sector extends into the High Plains and is called the Central Plains orogeny.",
        "The boundary between the Colorado orogeny and the Wyoming craton is the Cheyenne belt.",
        "Geologists dated the eastern sector again in 2004.",
    ], page.paragraph_sizes)
    assert len(page.paragraph_sizes) > 1  # kept for the original observation style
    q = server.requests[0].query
    assert q["prop"] == "extracts" and q["explaintext"] == "1" and q["redirects"] == "1"
    assert q["titles"] == "Colorado orogeny" and q["format"] == "json"
    assert server.requests[0].headers["User-Agent"].startswith("react-finetune-pipeline/")


def test_first_letter_and_underscores_are_normalised_by_the_api(server, tmp_path):
    wiki = live(server, tmp_path)
    assert wiki.get_page("colorado_orogeny").title == "Colorado orogeny"
    assert len(server.requests) == 1


def test_other_case_differences_fall_back_to_near_match(server, tmp_path):
    page = live(server, tmp_path).get_page("COLORADO OROGENY")
    assert page.title == "Colorado orogeny"
    assert [r.query.get("srwhat") or r.query.get("titles") for r in server.requests] == [
        "COLORADO OROGENY", "nearmatch", "Colorado orogeny"]


def test_miss_returns_none_and_similar_titles_are_ranked(server, tmp_path):
    wiki = live(server, tmp_path)
    assert wiki.get_page("Adam Clayton Powell") is None
    similar = wiki.similar_titles("Adam Clayton Powell")
    assert similar[:2] == ["Adam Clayton Powell (film)", "Adam Clayton Powell III"]
    assert wiki.similar_titles("Adam Clayton Powell", k=1) == similar[:1]
    search = server.requests[-1].query
    assert search["list"] == "search" and search["srlimit"] == "1" and search["srnamespace"] == "0"
    assert wiki.similar_titles("zzzz nothing") == []


def test_redirects_are_followed(server, tmp_path):
    page = live(server, tmp_path).get_page("Milhouse")
    assert page.title == "Milhouse Van Houten"
    assert page.sentences[1] == "Milhouse was named after U.S."


def test_disambiguation_text_passes_through(server, tmp_path):
    page = live(server, tmp_path).get_page("Mercury")
    assert page.is_disambiguation
    assert page.sentences[0] == "Mercury may refer to:"


def test_unicode_titles_and_search(server, tmp_path):
    wiki = live(server, tmp_path)
    assert wiki.get_page("Zurich").title == "Zürich"
    assert wiki.get_page("Zürich").sentences == ["Zürich is the largest city in Switzerland.",
                                                 "It lies on Lake Zürich."]
    tokyo = wiki.get_page("東京都")
    assert tokyo.title == "東京都" and tokyo.sentences[0].startswith("東京都は")
    assert wiki.similar_titles("lake zürich") == ["Zürich"]
    again = live(server, tmp_path)  # the unicode keys round-trip through the cache
    before = len(server.requests)
    assert again.get_page("東京都") == tokyo and again.similar_titles("lake zürich") == ["Zürich"]
    assert len(server.requests) == before


def test_a_rerun_sends_no_request_at_all(server, tmp_path):
    first = live(server, tmp_path)
    calls = [("get", "Colorado orogeny"), ("get", "Milhouse"), ("get", "Adam Clayton Powell"),
             ("get", "COLORADO OROGENY"), ("similar", "Adam Clayton Powell"),
             ("similar", "[Mercury]")]

    def run(wiki):
        return [wiki.get_page(x) if kind == "get" else wiki.similar_titles(x) for kind, x in calls]

    answers = run(first)
    sent = len(server.requests)
    # 1 + 1 + (exact + near-match) + (exact + near-match; the page itself is cached) + 2
    assert sent == first.requests_sent == 8
    first.close()
    second = live(server, tmp_path)  # a new process would open the same file
    assert run(second) == answers
    assert len(server.requests) == sent and second.requests_sent == 0


def test_the_environment_shows_the_papers_observation_text(server, tmp_path):
    env = WikiEnv(live(server, tmp_path), score=get_task("hotpotqa").scores)
    env.reset("Where does the eastern sector extend?", "High Plains")
    obs, *_ = env.step("Search[Colorado orogeny]")
    assert obs.startswith("The Colorado orogeny was an episode") and obs.endswith("2004.")
    obs, *_ = env.step("Lookup[eastern sector]")
    assert obs == ("(Result 1 / 2) The eastern sector extends into the High Plains and is "
                   "called the Central Plains orogeny.")
    obs, *_ = env.step("Search[Adam Clayton Powell]")
    assert obs.startswith("Could not find Adam Clayton Powell. Similar: ['Adam Clayton Powell")
    obs, *_ = env.step("Search[Mercury]")
    assert obs.startswith("Could not find [Mercury]. Similar: [")


@pytest.mark.parametrize("kind", FAULT_KINDS + ("api:maxlag",))
def test_each_fault_is_retried_and_only_the_answer_is_cached(server, tmp_path, kind):
    server.inject(Fault(kind, retry_after="0"))
    wiki = live(server, tmp_path)
    assert wiki.get_page("Zürich").title == "Zürich"
    assert [r.fault for r in server.requests] == [kind, None]
    assert len(wiki.cache) == 1


def test_exhausted_retries_raise_and_cache_nothing(server, tmp_path):
    server.inject(*["503"] * 3)
    wiki = live(server, tmp_path, max_retries=2)
    with pytest.raises(RequestFailed, match=r"gave up after 3 attempts; last: HTTP 503") as info:
        wiki.get_page("Zürich")
    assert "\n" not in str(info.value)
    assert len(wiki.cache) == 0
    assert wiki.get_page("Zürich").title == "Zürich"  # the API is back: asked again, cached
    assert len(wiki.cache) == 1 and len(server.requests) == 4


def test_a_permanent_api_error_is_not_retried(server, tmp_path):
    server.inject(Fault("api:permissiondenied"))
    wiki = live(server, tmp_path)
    with pytest.raises(RequestFailed, match="API error permissiondenied"):
        wiki.similar_titles("Zürich")
    assert len(server.requests) == 1 and len(wiki.cache) == 0


def test_titles_that_cannot_exist_cost_no_request(server, tmp_path):
    wiki = live(server, tmp_path)
    assert wiki.get_page("") is None and wiki.get_page("   ") is None
    assert wiki.get_page("Zürich|Mercury") is None  # '|' would ask for two pages
    assert wiki.similar_titles("") == [] and wiki.similar_titles("x", k=0) == []
    assert server.requests == []
    assert wiki.get_page("[Mercury]") is None  # invalid per the API: a miss, not an error


def test_bad_settings_are_one_line_errors(tmp_path):
    with pytest.raises(PipelineError, match="not an http"):
        LiveWikipedia(api_url="en.wikipedia.org/w/api.php", cache_path=tmp_path / "c.sqlite")
    bad = tmp_path / "not-a-db.sqlite"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(PipelineError, match="not a usable response cache"):
        LiveWikipedia(api_url="http://127.0.0.1:9/w/api.php", cache_path=bad)
