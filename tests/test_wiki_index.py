"""The local Wikipedia index: corpus readers, the SQLite/FTS5 file, lookups and similar titles.

    .venv/bin/python -m pytest tests/test_wiki_index.py -q
"""

from __future__ import annotations

import bz2
import io
import json
import pickle
import sqlite3
import tarfile
import threading
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.wiki import index as index_module
from pipeline.wiki.corpus import _json_list, iter_pages, split_sentences, strip_links
from pipeline.wiki.index import INDEX_FORMAT, LocalIndex, build_index, query_tokens, title_key

DUMP_DIR = "enwiki-20171001-pages-meta-current-withlinks-abstracts"


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def page(title: str, *sentences: str) -> dict:
    return {"title": title, "sentences": list(sentences)}


def dump_line(page_id: int, title: str, sentences: list, linked: list | None = None) -> dict:
    """A line of HotpotQA's abstracts dump (fields as its README describes them)."""
    return {
        "id": str(page_id), "url": f"https://en.wikipedia.org/wiki?curid={page_id}", "title": title,
        "text": sentences, "text_with_links": linked or sentences,
        "charoffset": [[[0, 1]] for _ in sentences], "charoffset_with_links": [[[0, 1]] for _ in sentences],
    }


DUMP_SHARDS = {
    "AA/wiki_00.bz2": [
        dump_line(12, "Anarchism", ["Anarchism is a political philosophy.", " It rejects hierarchy."],
                  ['Anarchism is a <a href="political%20philosophy">political philosophy</a>.', " It rejects hierarchy."]),
        dump_line(25, "Autism", ["Autism is a <a href=\"neurodevelopmental%20disorder\">neurodevelopmental disorder</a>.",
                                 " It affects communication."]),
    ],
    "AA/wiki_01.bz2": [
        dump_line(39, "Albedo", [["Albedo"], ["Albedo is the measure of reflection.", " It is dimensionless."], ["Second paragraph."]]),
        dump_line(40, "Empty page", []),
    ],
    "AB/wiki_00.bz2": [dump_line(303, "Alabama", ["Alabama is a state in the United States."])],
}


def write_dump(tmp_path: Path, shards: dict[str, list] | None = None, corrupt: str | None = None) -> Path:
    """A tiny archive in the format of enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2."""
    archive = tmp_path / f"{DUMP_DIR}.tar.bz2"
    with tarfile.open(archive, "w:bz2") as tar:
        for name, lines in (shards or DUMP_SHARDS).items():
            text = "".join(json.dumps(line) + "\n" for line in lines)
            if name == corrupt:
                text = text.replace("}\n", "\n", 1)  # first line loses its closing brace
            data = bz2.compress(text.encode("utf-8"))
            info = tarfile.TarInfo(f"{DUMP_DIR}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


@pytest.fixture
def small_index(tmp_path) -> LocalIndex:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [
        page("Zebra crossing", "A zebra crossing is a pedestrian crossing.", " It has white stripes."),
        page("Horse", "The horse is a mammal.", " It is not a zebra, zebra, zebra."),
        page("Paris", "Paris is the capital of France."),
        page("Paris (film)", "Paris is a 2008 French film."),
        page("Cover version", "A cover version is a new performance."),
        page("Cover Version", "Cover Version is an album by Steven Wilson."),
        page("Москва", "Москва — столица России."),
        page("東京都", "東京都は日本の首都である。"),
        page("Café Society", "Café Society is a 2016 film by Woody Allen."),
        page("Straße", "Straße is the German word for street."),
    ])
    with LocalIndex(build_index([corpus], tmp_path / "wiki.sqlite").out) as index:
        yield index


# ---------------------------------------------------------------- text rules


def test_title_key_normalises_unicode_case_underscores_and_spaces():
    assert title_key("  Milhouse_Van   Houten ") == "milhouse van houten"
    assert title_key("ＡＢＣ　Ｄ") == "abc d"  # full-width letters and space (NFKC)
    assert title_key("STRASSE") == title_key("Straße")  # case-fold, not lower()
    assert title_key("Cafe\u0301") == title_key("Café")  # combining accent == precomposed
    assert title_key("\t\n") == ""


def test_split_sentences_rule():
    text = ("Mr. Smith moved to St. Louis in 1990. He met J. R. R. Tolkien there! Was it 1991? "
            "\"Yes,\" he said. The U.S. Army was there, e.g. at camp.\nA new line starts a sentence")
    assert split_sentences(text) == [
        "Mr. Smith moved to St. Louis in 1990.",
        "He met J. R. R. Tolkien there!",
        "Was it 1991?",
        "\"Yes,\" he said.",
        "The U.S. Army was there, e.g. at camp.",
        "A new line starts a sentence",
    ]
    assert split_sentences("version 2.0 is out. it is lower-case after.") == ["version 2.0 is out. it is lower-case after."]
    assert split_sentences("  \n ") == []


def test_strip_links_keeps_anchor_text():
    assert strip_links('A <a href="political%20philosophy">political philosophy</a>.') == "A political philosophy."
    assert strip_links("<A HREF='x'>X</A> and 3 < 4") == "X and 3 < 4"


def test_query_tokens_are_plain_words_capped():
    assert query_tokens('"NEAR(a* OR b)": -c ^d {title}') == ["near", "a", "or", "b", "c", "d", "title"]
    assert query_tokens("東京都 Москва café") == ["東京都", "москва", "café"]
    assert len(query_tokens(" ".join(f"w{i}" for i in range(5000)))) == index_module.MAX_QUERY_TOKENS
    assert query_tokens("x" * 10_000) == ["x" * index_module.MAX_TOKEN_CHARS]
    assert query_tokens("!!! ... ___") == []


# ---------------------------------------------------------------- readers


def test_jsonl_pages_with_sentences_or_text(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [
        page("A", "First.", " Second, with its HotpotQA leading space.", "   "),
        {"title": "B", "text": "One sentence. Another one! A third?"},
        {"title": "C", "text": ["Listed.", " Sentences."]},
        page("Nothing", " ", ""),
    ])
    pages = {p.title: p.sentences for p in iter_pages(corpus)}
    assert pages == {
        "A": ["First.", "Second, with its HotpotQA leading space."],
        "B": ["One sentence.", "Another one!", "A third?"],
        "C": ["Listed.", "Sentences."],
    }
    stats = build_index([corpus], tmp_path / "i.sqlite")
    assert stats.pages == 3 and stats.sources[0]["empty_pages"] == 1


def test_hotpotqa_question_files_dedupe_context_titles(tmp_path):
    q1 = {"_id": "1", "question": "?", "answer": "x",
          "context": [["Alpha", ["Alpha is first.", " It leads."]], ["Beta", ["Beta is second."]]]}
    q2 = {"_id": "2", "question": "?", "answer": "y",
          "context": [["Beta", ["Beta is second."]], ["Gamma", ["Gamma is third."]]]}
    hf = {"id": "3", "context": {"title": ["Delta"], "sentences": [["Delta is fourth."]]}}
    jsonl = write_jsonl(tmp_path / "with_context.jsonl", [q1, q2, hf])
    official = tmp_path / "hotpot_dev_distractor_v1.json"
    official.write_text(json.dumps([q1, q2, hf], indent=2), encoding="utf-8")
    for source in (jsonl, official):
        pages = [(p.title, p.sentences) for p in iter_pages(source)]
        assert pages == [("Alpha", ["Alpha is first.", "It leads."]), ("Beta", ["Beta is second."]),
                         ("Gamma", ["Gamma is third."]), ("Delta", ["Delta is fourth."])]
    assert build_index([official], tmp_path / "i.sqlite").sources[0]["repeated_titles"] == 1


def test_json_list_is_decoded_incrementally():
    records = [{"title": f"T{i}", "sentences": ["x" * (i * 7)]} for i in range(30)]
    text = json.dumps(records, indent=1)
    decoded = [r for _, r in _json_list(io.StringIO(text), "f.json", chunk_chars=16)]
    assert decoded == records
    where = [w for w, _ in _json_list(io.StringIO(text), "f.json", chunk_chars=16)]
    assert where[:2] == ["f.json:2", "f.json:8"]  # the line each record starts on


def test_enwiki_abstracts_dump_archive_folder_and_shard(tmp_path):
    archive = write_dump(tmp_path)
    expected = [
        ("Anarchism", ["Anarchism is a political philosophy.", "It rejects hierarchy."]),
        ("Autism", ["Autism is a neurodevelopmental disorder.", "It affects communication."]),
        ("Albedo", ["Albedo is the measure of reflection.", "It is dimensionless.", "Second paragraph."]),
        ("Alabama", ["Alabama is a state in the United States."]),
    ]
    assert [(p.title, p.sentences) for p in iter_pages(archive)] == expected
    folder = tmp_path / "unpacked"
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    assert [(p.title, p.sentences) for p in iter_pages(folder / DUMP_DIR)] == expected
    assert [p.title for p in iter_pages(folder / DUMP_DIR / "AB" / "wiki_00.bz2")] == ["Alabama"]

    stats = build_index([archive], tmp_path / "dump.sqlite")
    assert (stats.pages, stats.sources[0]["empty_pages"], stats.sources[0]["container"]) == (4, 1, "dump-tar")
    with LocalIndex(stats.out) as index:
        assert index.get_page("anarchism").sentences == expected[0][1]
        assert index.similar_titles("philosophy") == ["Anarchism"]


# ---------------------------------------------------------------- bad input


def test_missing_unknown_and_empty_sources(tmp_path):
    out = tmp_path / "i.sqlite"
    with pytest.raises(PipelineError, match=r"nope\.jsonl: corpus file not found"):
        build_index([tmp_path / "nope.jsonl"], out)
    (tmp_path / "pages.csv").write_text("title,text\n")
    with pytest.raises(PipelineError, match="unknown corpus format"):
        build_index([tmp_path / "pages.csv"], out)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(PipelineError, match=r"empty\.jsonl: no pages found"):
        build_index([tmp_path / "empty.jsonl"], out)
    with pytest.raises(PipelineError, match="no corpus given"):
        build_index([], out)
    assert list(tmp_path.glob("*.sqlite*")) == []  # nothing half-written, no temp file left


@pytest.mark.parametrize("bad_line, message", [
    ('{"title": "B", "sentences": ["x"]', r"c\.jsonl:2: not valid JSON"),
    ('["not", "an", "object"]', r"c\.jsonl:2: expected a JSON object"),
    ('{"name": "B"}', r"c\.jsonl:2: not a page"),
    ('{"title": "", "sentences": ["x"]}', r"c\.jsonl:2: a page needs a non-empty string title"),
    ('{"title": "B", "sentences": [1, 2]}', r"c\.jsonl:2: page 'B': a sentence must be a string"),
    ('{"context": [["only a title"]]}', r"c\.jsonl:2: a context entry must be \[title, sentences\]"),
])
def test_corrupt_line_names_file_and_line(tmp_path, bad_line, message):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps(page("A", "a.")) + "\n" + bad_line + "\n" + json.dumps(page("C", "c.")) + "\n")
    with pytest.raises(PipelineError, match=message):
        build_index([corpus], tmp_path / "i.sqlite")


def test_corrupt_archive_member_line_and_bz2_data(tmp_path):
    archive = write_dump(tmp_path, corrupt="AA/wiki_01.bz2")
    with pytest.raises(PipelineError, match=rf"abstracts\.tar\.bz2:{DUMP_DIR}/AA/wiki_01\.bz2:1: not valid JSON"):
        build_index([archive], tmp_path / "i.sqlite")
    shard = tmp_path / "wiki_00.bz2"
    shard.write_bytes(bz2.compress(b'{"title": "A", "text": ["a."]}\n' * 50)[:60])  # cut short
    with pytest.raises(PipelineError, match=r"wiki_00\.bz2: unreadable or truncated compressed data"):
        build_index([shard], tmp_path / "i.sqlite")
    (tmp_path / "broken.tar.bz2").write_bytes(b"this is not an archive")
    with pytest.raises(PipelineError, match="not a readable tar archive"):
        build_index([tmp_path / "broken.tar.bz2"], tmp_path / "i.sqlite")


def test_truncated_json_list_and_non_utf8(tmp_path):
    official = tmp_path / "hotpot.json"
    official.write_text(json.dumps([page("A", "a."), page("B", "b.")], indent=1)[:-10])
    with pytest.raises(PipelineError, match=r"hotpot\.json:\d+: not valid JSON"):
        build_index([official], tmp_path / "i.sqlite")
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(json.dumps(page("A", "a.")).encode() + b"\n" + '{"title": "Caf\xe9", "sentences": ["x"]}\n'.encode("latin-1"))
    with pytest.raises(PipelineError, match=r"latin1\.jsonl:2: not UTF-8"):
        build_index([latin1], tmp_path / "i.sqlite")


def test_failed_rebuild_keeps_the_previous_index(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", [page("Kept", "It stays.")])
    out = tmp_path / "wiki.sqlite"
    build_index([good], out)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(page("New", "n.")) + "\n{broken\n")
    with pytest.raises(PipelineError, match=r"bad\.jsonl:2"):
        build_index([bad], out)
    with LocalIndex(out) as index:
        assert index.get_page("kept").sentences == ["It stays."] and index.get_page("New") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "good.jsonl", "wiki.sqlite"]


def test_missing_corrupt_or_foreign_index_file(tmp_path):
    with pytest.raises(PipelineError, match=r"wiki index not found; build it with `python -m pipeline wiki build"):
        LocalIndex(tmp_path / "absent.sqlite")
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"\x00not sqlite" * 500)
    with pytest.raises(PipelineError, match=r"not a usable wiki index .*python -m pipeline wiki build"):
        LocalIndex(garbage)
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t(x)").connection.close()
    with pytest.raises(PipelineError, match="not a usable wiki index"):
        LocalIndex(other)
    future = tmp_path / "future.sqlite"
    build_index([write_jsonl(tmp_path / "c.jsonl", [page("A", "a.")])], future)
    with sqlite3.connect(future) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'format'")
    with pytest.raises(PipelineError, match=f"format 99, this code reads format {INDEX_FORMAT}"):
        LocalIndex(future)


# ---------------------------------------------------------------- the index


def test_duplicates_first_wins_and_case_variants_resolve(tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", [page("Cover version", "Lower v."), page("Cover Version", "Upper V.")])
    second = write_jsonl(tmp_path / "b.jsonl", [page("Cover version", "A later duplicate."), page("Other", "o.")])
    stats = build_index([first, second], tmp_path / "i.sqlite")
    assert (stats.pages, stats.duplicate_titles) == (3, 1)
    with LocalIndex(stats.out) as index:
        assert index.get_page("Cover version").sentences == ["Lower v."]  # first source won
        assert index.get_page("Cover Version").title == "Cover Version"  # exact title preferred
        assert index.get_page("cover version").title == "Cover version"  # Wikipedia capitalisation
        assert index.get_page("COVER_VERSION").title == "Cover version"  # else the first indexed
        assert index.meta["duplicate_titles"] == 1


def test_meta_records_sources_and_build(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [page("A", "a."), page("B", "b.")])
    with LocalIndex(build_index([corpus], tmp_path / "i.sqlite").out) as index:
        meta = index.meta
    assert meta["format"] == INDEX_FORMAT and meta["pages"] == 2 and index.page_count == 2
    source = meta["sources"][0]
    assert source["path"] == str(corpus) and source["size"] == corpus.stat().st_size
    assert len(source["head_sha256"]) == 64 and source["pages"] == 2
    assert meta["sqlite_version"] == sqlite3.sqlite_version and meta["build_seconds"] >= 0
    assert meta["tokenizer"] == index_module.TOKENIZER and "built_at" in meta


def test_lookup_by_normalised_title(small_index):
    assert small_index.get_page("paris").title == "Paris"
    assert small_index.get_page("  paris_(FILM) ").title == "Paris (film)"
    assert small_index.get_page("москва").sentences == ["Москва — столица России."]
    assert small_index.get_page("東京都").title == "東京都"
    assert small_index.get_page("STRASSE").title == "Straße"
    assert small_index.get_page("Cafe\u0301 society").title == "Café Society"
    assert small_index.get_page("Pari") is None and small_index.get_page("") is None


def test_similar_titles_rank_title_matches_first(small_index):
    assert small_index.similar_titles("zebra") == ["Zebra crossing", "Horse"]  # title beats 3 body hits
    assert small_index.similar_titles("Paris", 1) == ["Paris"]
    assert set(small_index.similar_titles("paris 2008")) == {"Paris", "Paris (film)"}
    assert small_index.similar_titles("paris 2008")[0] == "Paris (film)"
    assert small_index.similar_titles("Москва")[0] == "Москва"
    assert small_index.similar_titles("cafe")[0] == "Café Society"  # diacritics ignored
    assert small_index.similar_titles("zebra", 0) == []


@pytest.mark.parametrize("query", [
    '"', '""', '"Paris', "Paris\"'", "AND", "OR", "NOT", "Paris AND", "OR Paris", "NEAR(Paris film)",
    "NEAR/2", "*", "Paris*", "Par*is", "(", ")", "(Paris", "Paris)", ":", "title:Paris", "{title}: Paris",
    "-Paris", "^Paris", "Paris + film", "\\", "\x00Paris", "'; DROP TABLE pages; --", "😀 Paris",
    "Paris" * 2000, "x" * 10_000, "東京", "Москва город", "القاهرة", "Ελλάδα",
])
def test_similar_titles_never_raise_on_fts5_syntax_or_odd_text(small_index, query):
    titles = small_index.similar_titles(query)
    assert isinstance(titles, list) and all(isinstance(t, str) for t in titles) and len(titles) <= 5
    if "Paris" in query and len(query) < 100:
        assert titles and titles[0] in {"Paris", "Paris (film)"}  # the operator is just a word


def test_words_in_most_pages_carry_no_weight(tmp_path, monkeypatch):
    corpus = write_jsonl(tmp_path / "c.jsonl", [page(f"Page {i}", f"The page number {i}.") for i in range(9)]
                         + [page("Zebra", "The zebra.")])
    with LocalIndex(build_index([corpus], tmp_path / "i.sqlite").out) as index:
        assert index.similar_titles("the zebra") == ["Zebra"]  # "the" (in every page) is dropped
        assert len(index.similar_titles("the")) == 5  # nothing else left, small corpus: all must match
        monkeypatch.setattr(index_module, "POSTINGS_BUDGET", 5)  # as if the corpus were large
        assert index.similar_titles("the") == []
        assert index.similar_titles("the zebra") == ["Zebra"]


def test_common_words_fall_back_to_all_words_then_the_rarest(tmp_path, monkeypatch):
    corpus = write_jsonl(tmp_path / "c.jsonl", [
        page("Alpha beta", "Both words."), page("Alpha", "Alpha alone."), page("Beta", "Beta alone."),
        page("Gamma", "alpha gamma."), page("Delta", "delta."), page("Epsilon", "epsilon."),
        page("Zeta", "zeta."), page("Eta", "eta."),
    ])
    monkeypatch.setattr(index_module, "POSTINGS_BUDGET", 1)  # every word counts as too common
    with LocalIndex(build_index([corpus], tmp_path / "i.sqlite").out) as index:
        assert index.similar_titles("alpha beta") == ["Alpha beta"]  # AND: only the page with both
        assert index.similar_titles("alpha gamma") == ["Gamma"]
        # no page has both: the first of the (equally rare) words alone
        assert set(index.similar_titles("alpha zzz")) == {"Alpha beta", "Alpha", "Gamma"}


def test_pickle_and_threads(small_index):
    clone = pickle.loads(pickle.dumps(small_index))
    assert clone.get_page("Paris").title == "Paris" and clone.path == small_index.path
    clone.close()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(50):
                assert small_index.get_page("Horse").title == "Horse"
                assert small_index.similar_titles("zebra")[0] == "Zebra crossing"
        except BaseException as exc:  # noqa: BLE001 - surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
