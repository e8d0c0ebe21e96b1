"""Redirects, the near-match rule and the full-article readers, on tiny files made here.

    .venv/bin/python -m pytest tests/test_wiki_redirects.py -q
"""

from __future__ import annotations

import bz2
import io
import json
import tarfile

import pytest

from pipeline.core.errors import PipelineError
from pipeline.wiki.corpus import iter_pages, read_redirects
from pipeline.wiki.env import WikiEnv
from pipeline.wiki.index import LocalIndex, build_index, near_key

PAGES = [
    {"title": "Milhouse Van Houten", "sentences": ["Milhouse Van Houten is a character."]},
    {"title": "The Beatles", "sentences": ["The Beatles were an English rock band."]},
    {"title": "Pokémon", "sentences": ["Pokémon is a media franchise."]},
    {"title": "Beatles (disambiguation)", "sentences": ["Beatles may refer to:", "a band"]},
]
XML = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">
  <siteinfo><sitename>Wikipedia</sitename></siteinfo>
  <page><title>Milhouse</title><ns>0</ns><id>1</id><redirect title="Milhouse Van Houten" />
    <revision><text>#REDIRECT [[Milhouse Van Houten]]</text></revision></page>
  <page><title>Talk:Milhouse</title><ns>1</ns><id>2</id><redirect title="Milhouse Van Houten" />
    <revision><text>#REDIRECT</text></revision></page>
  <page><title>Milhouse Van Houten</title><ns>0</ns><id>3</id>
    <revision><text>'''Milhouse''' is a character.</text></revision></page>
</mediawiki>
"""


def write_corpus(folder, pages=PAGES):
    path = folder / "corpus.jsonl"
    path.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pages), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wiki")
    xml = folder / "enwiki-pages-articles.xml.bz2"
    xml.write_bytes(bz2.compress(XML.encode()))
    table = folder / "redirects.tsv"
    table.write_text("Fab Four\tThe Beatles\nPikachu franchise\tPokémon\n", encoding="utf-8")
    stats = build_index([write_corpus(folder), xml, table], folder / "wiki.sqlite")
    assert stats.redirects == 3 and stats.pages == 4
    with LocalIndex(stats.out) as built:
        yield built


def test_xml_dump_redirects_of_the_main_namespace_only(tmp_path):
    xml = tmp_path / "dump.xml"
    xml.write_text(XML, encoding="utf-8")
    assert list(read_redirects(xml)) == [("Milhouse", "Milhouse Van Houten")]


def test_an_xml_dump_alone_is_refused_in_one_line_before_it_is_read(tmp_path):
    """The dump a user downloads (pages-articles) gives redirects only: no index is built."""
    import subprocess
    import sys

    xml = tmp_path / "enwiki-latest-pages-articles.xml.bz2"
    xml.write_bytes(bz2.compress(XML.encode()))
    out = tmp_path / "wiki.sqlite"
    proc = subprocess.run([sys.executable, "-m", "pipeline", "wiki", "build", "--corpus", str(xml), "--out", str(out),
                           "--no-progress"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {xml}: no page text to index: a pages-articles XML dump (or a from<TAB>to .tsv) "
                           "only adds redirects beside the pages of another source; give one that holds page "
                           "text too: a corpus JSONL, "), line
    assert "wikimedia/wikipedia .parquet" in line and "data fetch wiki-processed" in line
    assert not out.exists() and list(tmp_path.iterdir()) == [xml]
    table = tmp_path / "redirects.tsv"  # redirect sources together are still no page text
    table.write_text("Fab Four\tThe Beatles\n", encoding="utf-8")
    with pytest.raises(PipelineError, match="no page text to index"):
        build_index([xml, table], out)
    with LocalIndex(build_index([write_corpus(tmp_path), xml], out).out) as idx:  # beside pages: fine
        assert idx.page_count == 4 and idx.get_page("Milhouse").title == "Milhouse Van Houten"


def test_an_index_without_pages_is_refused_when_opened(tmp_path):
    """An index an older build wrote from a dump alone: every Search would miss; say why instead."""
    import sqlite3

    path = build_index([write_corpus(tmp_path)], tmp_path / "w.sqlite").out
    with sqlite3.connect(path) as db:  # what the older build left: the redirects table, no pages
        db.execute("DELETE FROM pages")
        db.execute("UPDATE meta SET value = '0' WHERE key = 'pages'")
    with pytest.raises(PipelineError, match=r"w.sqlite: not a usable wiki index \(it holds no pages, only 0 "
                       r"redirects; build it from a source with page text: a corpus JSONL"):
        LocalIndex(path)


def test_search_follows_a_redirect(index):
    env = WikiEnv(index)
    env.reset("q")
    assert env.step("Search[Milhouse]")[0] == "Milhouse Van Houten is a character."
    assert index.get_page("fab four").title == "The Beatles"  # the table's redirect, any case


@pytest.mark.parametrize("query, title", [
    ("Beatles", "The Beatles"),            # leading article
    ("the  beatles", "The Beatles"),       # case and whitespace
    ("THE_BEATLES", "The Beatles"),        # underscores
    ("Pokemon", "Pokémon"),                # diacritics
    ("pikachu_franchise", "Pokémon"),      # a redirect, near-matched
])
def test_near_match_like_the_go_box(index, query, title):
    assert index.get_page(query).title == title


def test_exact_titles_win_over_near_matches(tmp_path):
    corpus = write_corpus(tmp_path, [{"title": "Beatles", "sentences": ["Beatles, the exact title."]},
                                     {"title": "The Beatles", "sentences": ["The band."]}])
    with LocalIndex(build_index([corpus], tmp_path / "w.sqlite").out) as idx:
        assert idx.get_page("beatles").title == "Beatles"
        assert idx.get_page("the beatles").title == "The Beatles"
        assert idx.get_page("Nothing like it") is None


def test_near_key():
    assert near_key("The  Beatles") == near_key("beatles") == "beatles"
    assert near_key("Éire_") == "eire" and near_key("A") == "a" and near_key("An Lar") == "lar"


def test_a_bad_redirect_table_names_the_line(tmp_path):
    table = tmp_path / "r.tsv"
    table.write_text("Good\tTarget\nonly one column\n", encoding="utf-8")
    with pytest.raises(PipelineError, match=r"r.tsv:2: expected 'from<TAB>to'"):
        build_index([write_corpus(tmp_path), table], tmp_path / "w.sqlite")
    assert not (tmp_path / "w.sqlite").exists()


def processed_dump(folder):
    """HotpotQA's processed full-article dump in miniature: tar.bz2 of bz2 JSON-lines shards."""
    record = {"id": "1", "url": "u", "title": "Colorado orogeny", "text": [
        ["Colorado orogeny"],
        ["The Colorado orogeny was an episode of mountain building.", " It was in Colorado."],
        ["Later work dated the <a href=\"Cheyenne%20belt\">Cheyenne belt</a> to 1.7 Ga."]]}
    shard = bz2.compress((json.dumps(record) + "\n").encode())
    path = folder / "enwiki-20171001-pages-meta-current-withlinks-processed.tar.bz2"
    with tarfile.open(path, "w:bz2") as tar:
        info = tarfile.TarInfo("enwiki-20171001-pages-meta-current-withlinks-processed/AA/wiki_00.bz2")
        info.size = len(shard)
        tar.addfile(info, io.BytesIO(shard))
    return path


def test_processed_dump_keeps_every_paragraph_for_lookup(tmp_path):
    dump = processed_dump(tmp_path)
    [page] = list(iter_pages(dump))
    assert page.paragraph_sizes == (2, 1) and page.sentences[-1] == "Later work dated the Cheyenne belt to 1.7 Ga."
    with LocalIndex(build_index([dump], tmp_path / "w.sqlite").out) as idx:
        env = WikiEnv(idx, style="original")
        env.reset("q")
        env.step("search[Colorado orogeny]")
        assert env.step("lookup[Cheyenne]")[0] == "(Result 1 / 1) Later work dated the Cheyenne belt to 1.7 Ga.."


def test_wikimedia_wikipedia_parquet_through_datasets(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = {"id": ["1", "2"], "url": ["u1", "u2"], "title": ["Anarchism", "Albedo"],
            "text": ["Anarchism is a philosophy. It is old.\n\nHistory\n\nIt began long ago. Then more.",
                     "Albedo is a measure of reflection."]}
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.table(rows), path)
    pages = list(iter_pages(path))
    assert [p.title for p in pages] == ["Anarchism", "Albedo"]
    assert pages[0].paragraphs() == [["Anarchism is a philosophy.", "It is old."],  # "History": a heading
                                     ["It began long ago.", "Then more."]]
    with LocalIndex(build_index([path], tmp_path / "w.sqlite").out) as idx:
        assert idx.get_page("albedo").sentences == ["Albedo is a measure of reflection."]


def test_an_index_of_the_previous_format_is_rebuilt_on_first_use(tmp_path):
    import sqlite3

    from pipeline.wiki.config import WikiConfig, open_backend
    from pipeline.wiki.index import INDEX_FORMAT, index_format

    corpus = write_corpus(tmp_path)
    path = build_index([corpus], tmp_path / "w.sqlite").out
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '1' WHERE key = 'format'")
    assert index_format(path) == 1
    backend = open_backend(WikiConfig(index=path, corpus=[str(corpus)]))
    assert index_format(path) == INDEX_FORMAT and backend.get_page("Beatles").title == "The Beatles"


MILHOUSE = ("Milhouse Mussolini Van Houten is a fictional character in The Simpsons.\n\n"
            "Role in The Simpsons\n\n"
            "Milhouse is Bart Simpson's best friend. He lives in Springfield.\n\n"
            "Character\n\nCreation \n\n"  # a heading over a heading; the dataset leaves a trailing space
            "Milhouse was named after U.S. President Richard Nixon, whose middle name was Milhous.\n\n"
            "See also\n\n")


def test_section_headings_of_a_wikimedia_page_are_not_sentences(tmp_path):
    """wikimedia/wikipedia text puts each heading on a line of its own between blank lines; the
    original environment read <p> text only, so no observation may carry one (glued to the next
    sentence, "Role in The Simpsons Milhouse is ..."). Lines that end a sentence (":" too) stay."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = {"id": ["1", "2"], "url": ["u1", "u2"], "title": ["Milhouse Van Houten", "Mercury"],
            "text": [MILHOUSE, "Mercury may refer to:\n\nMercury (planet)\n\nMercury (element)\n"]}
    path = tmp_path / "train-00000-of-00041.parquet"
    pq.write_table(pa.table(rows), path)
    with LocalIndex(build_index([path], tmp_path / "w.sqlite").out) as idx:
        clean, original = WikiEnv(idx), WikiEnv(idx, style="original")
        clean.reset("q")
        original.reset("q")
        assert clean.step("Search[Milhouse Van Houten]")[0] == (
            "Milhouse Mussolini Van Houten is a fictional character in The Simpsons. Milhouse is Bart Simpson's "
            "best friend. He lives in Springfield. Milhouse was named after U.S. President Richard Nixon, whose "
            "middle name was Milhous.")
        shown = original.step("search[Milhouse Van Houten]")[0]
        assert shown.startswith("Milhouse Mussolini Van Houten is a fictional character in The Simpsons.. "
                                "Milhouse is Bart Simpson's best friend.")
        assert not any(h in shown for h in ("Role in", "Character", "Creation", "See also"))
        assert idx.get_page("Milhouse Van Houten").paragraph_sizes == (1, 2, 1)
        assert idx.get_page("Mercury").sentences == ["Mercury may refer to:"]  # still a disambiguation page
        assert clean.step("Search[Mercury]")[0].startswith("Could not find [Mercury]")
