"""`python -m pipeline wiki build|step|search|info` as a user runs them (subprocesses).

    .venv/bin/python -m pytest tests/test_wiki_cli.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    {"title": "Milhouse Van Houten", "sentences": ["Milhouse is a character.", " He was named after Richard Nixon.",
                                                   " Nixon's middle name was Milhous."]},
    {"title": "Houten", "sentences": ["Houten is a municipality."]},
    {"title": "Richard Nixon", "sentences": ["Richard Nixon was the 37th president."]},
] + [{"title": f"Filler {i}", "sentences": [f"Filler page {i}."]} for i in range(5)]


def wiki(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", "wiki", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "corpus.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PAGES), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def index(corpus) -> Path:
    out = corpus.parent / "wiki.sqlite"
    result = wiki("build", "--corpus", corpus, "--out", out, "--no-progress")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("indexed 8 pages from 1 source(s) in ") and "pages/s" in result.stdout
    return out


def test_step_prints_one_json_object_per_action(index):
    result = wiki("step", "--index", index, "--question", "Who?", "--answer", "Richard Nixon",
                  "Search[milhouse van houten]", "Lookup[Nixon]", "Lookup[nixon]", "Search[Van Houten]",
                  "Dance[x]", "Finish[Richard Nixon]")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["action"], r["observation"], r["done"]) for r in records] == [
        ("Search[milhouse van houten]",
         "Milhouse is a character. He was named after Richard Nixon. Nixon's middle name was Milhous.", False),
        ("Lookup[Nixon]", "(Result 1 / 2) He was named after Richard Nixon.", False),
        ("Lookup[nixon]", "(Result 1 / 2) He was named after Richard Nixon.", False),
        ("Search[Van Houten]", "Could not find Van Houten. Similar: ['Milhouse Van Houten', 'Houten'].", False),
        ("Dance[x]", "Invalid action: Dance[x]", False),
        ("Finish[Richard Nixon]", "Episode finished, reward = 1", True),
    ]
    assert records[-1]["reward"] == 1.0 and records[-1]["info"]["em"] == 1.0 and records[-1]["info"]["steps"] == 6


def test_step_limit_from_the_command_line(index):
    result = wiki("step", "--index", index, "--max-steps", "2", "Search[Houten]", "Search[Houten]", "Search[Houten]")
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["done"] for r in records] == [False, True, True]
    assert records[2]["observation"] == "Episode already finished."
    assert_one_line_error(wiki("step", "--index", index, "--max-steps", "0", "Search[x]"), "--max-steps")


def test_search_and_info(index, corpus):
    hit = json.loads(wiki("search", "--index", index, "houten").stdout)
    assert hit == {"title": "Houten", "sentences": ["Houten is a municipality."], "disambiguation": False}
    miss = json.loads(wiki("search", "--index", index, "-k", "1", 'NEAR("Nixon" AND *)').stdout)
    assert miss == {"title": None, "similar": ["Richard Nixon"]}
    meta = json.loads(wiki("info", "--index", index).stdout)
    assert meta["pages"] == 8 and meta["sources"][0]["path"] == str(corpus)


def test_bad_corpus_inputs_fail_in_one_line(tmp_path, corpus):
    out = tmp_path / "wiki.sqlite"
    assert_one_line_error(wiki("build", "--corpus", tmp_path / "absent.jsonl", "--out", out),
                          "absent.jsonl: corpus file not found")
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(PAGES[0]) + "\n{not json\n")
    assert_one_line_error(wiki("build", "--corpus", corpus, broken, "--out", out), "broken.jsonl:2: not valid JSON")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert_one_line_error(wiki("build", "--corpus", empty, "--out", out), "empty.jsonl: no pages found")
    assert not out.exists() and list(tmp_path.glob(".wiki.sqlite*")) == []
    assert_one_line_error(wiki("build", "--corpus", corpus, "--out", tmp_path), "is a folder")
    assert_one_line_error(wiki("build", "--corpus", corpus, "--out", corpus.parent / "corpus.jsonl" / "x.sqlite"),
                          "is a file, not a folder")


def test_bad_index_fails_in_one_line(tmp_path):
    assert_one_line_error(wiki("step", "--index", tmp_path / "none.sqlite", "Search[x]"),
                          "wiki index not found", "python -m pipeline wiki build")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"junk" * 1000)
    assert_one_line_error(wiki("search", "--index", junk, "x"), "not a usable wiki index", "python -m pipeline wiki build")
