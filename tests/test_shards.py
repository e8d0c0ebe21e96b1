"""Sharded generation and eval (`shard=i/n`, pipeline.core.shards) and their merge by `filter` and
`plot`: real `python -m pipeline` processes, the oracle stand-in teacher (oracle=exact, no model)
over the real local index.

    .venv/bin/python -m pytest tests/test_shards.py -q
"""

from __future__ import annotations

import json

import pytest
from episode_testdata import CORPUS, read_records, run_pipeline

from pipeline.core.errors import PipelineError
from pipeline.core.shards import Shard, parse_shard, shard_questions

N_QUESTIONS = 7  # not a multiple of the shard count: shards of 3, 2 and 2
METHODS = "methods=[react,act,cot,standard]"


# ------------------------------------------------------------------ the split itself

def test_shards_are_disjoint_cover_the_set_and_keep_their_questions_as_the_set_grows():
    questions = list(range(10))
    parts = [shard_questions(questions, Shard(i, 3)) for i in range(3)]
    assert sorted(q for part in parts for q in part) == questions
    assert [len(p) for p in parts] == [4, 3, 3]
    grown = [shard_questions(list(range(13)), Shard(i, 3)) for i in range(3)]
    assert all(g[:len(p)] == p for g, p in zip(grown, parts, strict=True))
    assert shard_questions(questions, None) is questions


@pytest.mark.parametrize("spec,message", [
    ("3/3", "shard '3/3' is out of range"),
    ("0/0", "shard '0/0' is out of range"),
    ("1", "shard '1' is not i/n"),
    ("a/b", "shard 'a/b' is not i/n"),
    ("-1/2", "shard '-1/2' is not i/n"),
])
def test_a_bad_shard_spec_is_a_one_line_error_with_an_example(spec, message):
    with pytest.raises(PipelineError, match=message) as info:
        parse_shard(spec)
    assert "e.g. shard=0/4" in str(info.value)


def test_more_shards_than_questions_is_refused():
    with pytest.raises(PipelineError, match="shard 4/5 holds no question: the set has only 3"):
        shard_questions([1, 2, 3], parse_shard("4/5"))


# ------------------------------------------------------------------ end to end

needs_corpus = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")


def generate(index, out, *extra):
    proc = run_pipeline("generate", "oracle=exact", "questions=offline-eval", f"limit={N_QUESTIONS}",
                        f"wiki.index={index}", f"out_dir={out}", METHODS, *extra)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def generated(index, tmp_path_factory):
    """One unsharded oracle generation and the same one in 3 shards (3 jobs, 3 folders)."""
    root = tmp_path_factory.mktemp("gen")
    generate(index, root / "whole")
    for i in range(3):
        generate(index, root / f"shard-{i}", f"shard={i}/3")
    return root


def datasets(folder):
    return {p.parent.name: p.read_bytes() for p in sorted(folder.glob("*/train.jsonl"))}


@needs_corpus
def test_filter_merges_a_sharded_generation_into_the_unsharded_datasets(generated):
    root = generated
    shard_ids = [{r["id"] for r in read_records(root / f"shard-{i}" / "react.jsonl")} for i in range(3)]
    assert [len(ids) for ids in shard_ids] == [3, 2, 2]
    assert set.union(*shard_ids) == {r["id"] for r in read_records(root / "whole" / "react.jsonl")}
    assert json.loads((root / "shard-1" / "manifest.json").read_text())["config"]["shard"] == "1/3"

    whole = run_pipeline("filter", f"inputs=[{root / 'whole'}]", f"out_dir={root / 'sft-whole'}")
    # shards given out of order: the merge does not depend on it
    shards = ",".join(str(root / f"shard-{i}") for i in (2, 0, 1))
    merged = run_pipeline("filter", f"inputs=[{shards}]", f"out_dir={root / 'sft-merged'}")
    assert whole.returncode == 0 and merged.returncode == 0, whole.stderr + merged.stderr
    got, want = datasets(root / "sft-merged"), datasets(root / "sft-whole")
    assert sorted(want) == ["act", "cot", "react", "standard"]
    assert got == want
    assert all(len(rows.splitlines()) >= 5 for rows in want.values())  # the oracle gets most right


@needs_corpus
def test_an_incomplete_or_repeated_shard_set_is_refused(generated):
    root = generated
    for inputs, message in (([0, 2], "shard set incomplete: missing 1/3"),
                            ([0, 1, 2, 1], "shard 1/3 is given twice")):
        folders = ",".join(str(root / f"shard-{i}") for i in inputs)
        proc = run_pipeline("filter", f"inputs=[{folders}]", f"out_dir={root / 'never'}")
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1
    assert not (root / "never" / "react").exists()


@needs_corpus
def test_a_shard_resumes_like_one_job_and_refuses_another_shard(generated, index):
    folder = generated / "shard-0"
    before = (folder / "react.jsonl").read_bytes()
    proc = generate(index, folder, "shard=0/3")
    assert (folder / "react.jsonl").read_bytes() == before  # nothing new to run
    assert "react: 3 episodes" in proc.stdout
    proc = run_pipeline("generate", "oracle=exact", "questions=offline-eval", f"limit={N_QUESTIONS}",
                        f"wiki.index={index}", f"out_dir={folder}", METHODS, "shard=1/3")
    assert proc.returncode == 2 and "with a different shard" in proc.stderr, proc.stderr


@needs_corpus
@pytest.mark.parametrize("extra,message", [
    (["shard=3/3"], "shard '3/3' is out of range"),
    (["shard=first"], "shard 'first' is not i/n"),
])
def test_a_bad_shard_exits_2_and_writes_nothing(index, tmp_path, extra, message):
    proc = run_pipeline("generate", "oracle=exact", "questions=offline-eval", "limit=3",
                        f"wiki.index={index}", f"out_dir={tmp_path / 'never'}", *extra)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and message in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "never").exists()


@needs_corpus
def test_in_target_mode_each_shard_aims_at_its_share(index, tmp_path):
    """target_correct=3 over 2 shards: each draws from its own half of the pool until it has 2."""
    for i in range(2):
        generate(index, tmp_path / f"t{i}", f"shard={i}/2", "target_correct=3", "max_in_flight=1", "methods=[react]")
    targets = [json.loads((tmp_path / f"t{i}" / "manifest.json").read_text())["stats"]["react"]["target"]
               for i in range(2)]
    assert [(t["target"], t["reached"], t["pool"]) for t in targets] == [(2, True, 4), (2, True, 3)]
    ids = [{r["id"] for r in read_records(tmp_path / f"t{i}" / "react.jsonl")} for i in range(2)]
    assert not ids[0] & ids[1]


@needs_corpus
def test_plot_merges_sharded_eval_summaries_into_the_unsharded_rows(index, tmp_path):
    base = ("eval", "oracle=exact", "size_class=540b", "params_b=540",
            "methods=[react,cot]", "questions=offline-eval", f"limit={N_QUESTIONS}", f"wiki.index={index}")
    runs = {"whole": []} | {f"shard-{i}": [f"shard={i}/2"] for i in range(2)}
    for name, extra in runs.items():
        proc = run_pipeline(*base, f"out_dir={tmp_path / name}", *extra)
        assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "shard-1" / "summary.json").read_text())
    assert {r["shard"] for r in rows} == {"1/2"} and rows[0]["n"] == 3

    def plot(names, out):
        summaries = ",".join(str(tmp_path / n / "summary.json") for n in names)
        return run_pipeline("plot", f"summaries=[{summaries}]", f"out_dir={tmp_path / out}", "reference_points=false")

    assert plot(["whole"], "p-whole").returncode == 0
    proc = plot(["shard-1", "shard-0"], "p-merged")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "p-merged" / "results.csv").read_text() == (tmp_path / "p-whole" / "results.csv").read_text()
    proc = plot(["shard-1"], "p-never")
    assert proc.returncode == 2 and "shard set incomplete: missing 0/2" in proc.stderr, proc.stderr
