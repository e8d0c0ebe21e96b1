"""Filter stage: keep/drop/dedup/cap, the dataset folder, stats, skips, refusal, CLI exit codes.

    .venv/bin/python -m pytest tests/test_filter.py -q
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.core.storage import read_jsonl, read_manifest, write_manifest
from pipeline.core.trajectory import Step, Trajectory, render
from pipeline.stages.filter import FilterConfig, run_filter, select, write_dataset_dir

REPO = Path(__file__).resolve().parents[1]
FIREACT = REPO.parent / "shared" / "data" / "fireact"


def episode(qid: str, method: str = "react", *, em: float = 1.0, f1: float | None = None, finished: bool = True,
            answer: str = "Paris", note: str = "") -> dict:
    question = f"Where is thing {qid}?{note}"
    if method in ("act", "react"):
        steps = [Step("I should search it." if method == "react" else None, f"Search[thing {qid}]",
                      f"Thing {qid} is in {answer}. It is old."),
                 Step("So it is Paris." if method == "react" else None, f"Finish[{answer}]",
                      "Episode finished, reward = 1")]
        traj = Trajectory(question, method, steps, answer)
    else:
        traj = Trajectory(question, method, [], answer, "It is in Paris." if method == "cot" else None)
    return {"id": qid, "question": question, "gold_answer": "Paris", "method": method, "teacher": "oracle",
            "prediction": answer, "em": em, "f1": em if f1 is None else f1, "finished": finished,
            "end_reason": "finish" if finished else "step_limit", "n_steps": len(traj.steps),
            "steps": [vars(s) for s in traj.steps], "trajectory": traj.to_dict(), "text": render(traj).text,
            "prompt_tokens": 10, "completion_tokens": 20, "seconds": 0.1, "source": "generate"}


def generate_folder(path: Path, by_method: dict[str, list[dict]], complete: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for method, episodes in by_method.items():
        (path / f"{method}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    write_manifest(path / "manifest.json", stage="generate", config={}, complete=complete)
    return path


def test_select_keeps_correct_finished_first_of_each_id():
    episodes = [episode("a", note=" first"), episode("b", em=0.0), episode("c", finished=False),
                episode("a", note=" second"), episode("d", f1=0.5), episode("e", "cot"),
                {**episode("f"), "trajectory": {"question": "q", "format": "bogus", "steps": []}}]
    result = select("react", episodes, FilterConfig(min_f1=0.8))
    assert [e["id"] for e in result.kept] == ["a"]
    assert result.kept[0]["question"].endswith(" first")
    assert dict(result.dropped) == {"incorrect": 1, "unfinished": 1, "duplicate": 1, "low_f1": 1, "bad_trajectory": 2}
    # without min_f1 the low-F1 one stays; without require_finished the unfinished correct one stays
    assert [e["id"] for e in select("react", episodes, FilterConfig(require_finished=False, shuffle=False)).kept] == ["a", "c", "d"]


def test_cap_is_seeded_and_keeps_input_order():
    episodes = [episode(f"q{i:02d}") for i in range(20)]
    first = select("react", episodes, FilterConfig(max_per_method=5, seed=1, shuffle=False))
    again = select("react", episodes, FilterConfig(max_per_method=5, seed=1, shuffle=False))
    other = select("react", episodes, FilterConfig(max_per_method=5, seed=2, shuffle=False))
    ids = [e["id"] for e in first.kept]
    assert len(ids) == 5 and ids == sorted(ids) and ids == [e["id"] for e in again.kept]
    assert ids != [e["id"] for e in other.kept]
    assert first.dropped["over_cap"] == 15 and first.seen == 20


def test_dataset_folder_rows_stats_card_manifest(tmp_path, capsys):
    inputs = generate_folder(tmp_path / "gen", {
        "react": [episode("a"), episode("b", em=0.0), episode("a")],
        "cot": [episode("a", "cot"), episode("b", "cot")],
        "cot_sc": [episode("z", "cot")],
    })
    out = tmp_path / "sft"
    stats = run_filter(FilterConfig(inputs=[str(inputs)], out_dir=str(out)))
    assert set(stats) == {"cot", "react"}
    assert stats["react"]["kept"] == 1 and stats["react"]["seen"] == 3
    assert stats["react"]["dropped"] == {"incorrect": 1, "duplicate": 1}
    assert stats["react"]["steps"]["histogram"] == {"2": 1}
    assert "react: kept 1 / 3 seen (dropped: incorrect 1, duplicate 1)" in capsys.readouterr().out
    rows = read_jsonl(out / "react" / "train.jsonl")
    expected = render(Trajectory.from_dict(episode("a")["trajectory"]))
    assert rows[0]["prompt"] == "Question: Where is thing a?\n" == expected.prompt
    assert rows[0]["completion"] == expected.completion and rows[0]["answer"] == "Paris"
    assert [rows[0]["completion"][s:e] for s, e in rows[0]["observation_spans"]] == \
        ["Thing a is in Paris. It is old.", "Episode finished, reward = 1"]
    assert set(rows[0]) == {"id", "question", "method", "prompt", "completion", "observation_spans", "answer", "source"}
    assert json.loads((out / "react" / "stats.json").read_text()) == stats["react"]
    assert "react trajectories" in (out / "react" / "README.md").read_text()
    manifest = read_manifest(out / "react" / "manifest.json")
    assert manifest["complete"] and manifest["stage"] == "filter" and manifest["counts"] == {"seen": 3, "kept": 1}
    assert manifest["format"] == "react" and "method" not in manifest
    assert read_manifest(out / "manifest.json")["formats"] == ["cot", "react"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary folders left


def test_datasets_library_loads_the_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    inputs = generate_folder(tmp_path / "gen", {"act": [episode("a", "act"), episode("b", "act")]})
    run_filter(FilterConfig(inputs=[str(inputs)], out_dir=str(tmp_path / "sft")))
    ds = datasets.load_dataset("json", data_files=str(tmp_path / "sft" / "act" / "train.jsonl"),
                               cache_dir=str(tmp_path / "cache"))["train"]
    assert ds.num_rows == 2 and ds[0]["completion"].startswith("Action 1: Search[thing a]")


def test_incomplete_or_missing_manifest_is_refused(tmp_path):
    inputs = generate_folder(tmp_path / "gen", {"react": [episode("a")]}, complete=False)
    with pytest.raises(PipelineError, match="incomplete"):
        run_filter(FilterConfig(inputs=[str(inputs)], out_dir=str(tmp_path / "sft")))
    (inputs / "manifest.json").unlink()
    with pytest.raises(PipelineError, match="no manifest"):
        run_filter(FilterConfig(inputs=[str(inputs)], out_dir=str(tmp_path / "sft")))
    assert not (tmp_path / "sft").exists()


def test_bad_requests_are_clear_errors(tmp_path):
    inputs = generate_folder(tmp_path / "gen", {"react": [episode("a")]})
    with pytest.raises(PipelineError, match="nothing to read"):
        run_filter(FilterConfig(out_dir=str(tmp_path / "sft")))
    with pytest.raises(PipelineError, match=r"no input episodes for \['act'\]"):
        run_filter(FilterConfig(inputs=[str(inputs)], formats=["act"], out_dir=str(tmp_path / "sft")))
    with pytest.raises(PipelineError, match="not training formats"):
        run_filter(FilterConfig(inputs=[str(inputs)], formats=["cot_sc"], out_dir=str(tmp_path / "sft")))
    generate_folder(tmp_path / "wrong", {"react": [episode("w", em=0.0)]})
    with pytest.raises(PipelineError, match="no method kept any episode"):
        run_filter(FilterConfig(inputs=[str(tmp_path / "wrong")], out_dir=str(tmp_path / "sft")))
    (inputs / "react.jsonl").write_text(json.dumps({"id": "a", "method": "react"}) + "\n")
    with pytest.raises(PipelineError, match="lacks em, finished, trajectory"):
        run_filter(FilterConfig(inputs=[str(inputs)], out_dir=str(tmp_path / "sft")))


def test_rerun_skips_until_inputs_or_settings_change(tmp_path, capsys):
    inputs = generate_folder(tmp_path / "gen", {"react": [episode("a"), episode("b")]})
    cfg = FilterConfig(inputs=[str(inputs)], out_dir=str(tmp_path / "sft"))
    run_filter(cfg)
    train = tmp_path / "sft" / "react" / "train.jsonl"
    inode = train.stat().st_ino
    capsys.readouterr()
    assert run_filter(cfg)["react"]["kept"] == 2
    assert "up to date" in capsys.readouterr().out and train.stat().st_ino == inode
    run_filter(FilterConfig(inputs=[str(inputs)], out_dir=str(tmp_path / "sft"), max_per_method=1))
    assert len(read_jsonl(train)) == 1
    (inputs / "react.jsonl").write_text(json.dumps(episode("c")) + "\n")
    os.utime(inputs / "react.jsonl", (1, 1))
    run_filter(cfg)
    assert [r["id"] for r in read_jsonl(train)] == ["c"]
    inode = train.stat().st_ino
    run_filter(FilterConfig(inputs=[str(inputs)], out_dir=str(tmp_path / "sft"), force=True))
    assert train.stat().st_ino != inode
    # inputs that no longer yield a react dataset remove the stale one instead of leaving it
    (inputs / "react.jsonl").write_text(json.dumps(episode("c", em=0.0)) + "\n")
    (inputs / "cot.jsonl").write_text(json.dumps(episode("c", "cot")) + "\n")
    run_filter(cfg)
    assert not (tmp_path / "sft" / "react" / "train.jsonl").exists() and (tmp_path / "sft" / "cot" / "train.jsonl").exists()
    assert read_manifest(tmp_path / "sft" / "manifest.json")["empty_formats"] == ["react"]
    # what failed is still kept, with why (and no train.jsonl a training could mistake for data)
    assert [(r["id"], r["why"]) for r in read_jsonl(tmp_path / "sft" / "react" / "failed.jsonl")] == [("c", "incorrect")]
    assert sorted(p.name for p in (tmp_path / "sft" / "react").iterdir()) == ["failed.jsonl", "manifest.json", "stats.json"]


def test_failed_write_keeps_the_previous_dataset(tmp_path, monkeypatch):
    target = tmp_path / "sft" / "react"
    write_dataset_dir(target, {"train.jsonl": "old\n"}, {"stage": "filter", "config": {}, "complete": True})

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("pipeline.stages.filter.write_manifest", broken)
    with pytest.raises(OSError):
        write_dataset_dir(target, {"train.jsonl": "new\n"}, {"stage": "filter", "config": {}, "complete": True})
    assert (target / "train.jsonl").read_text() == "old\n"
    assert [p.name for p in target.parent.iterdir()] == ["react"]


def _word_tokenizer(path: Path, words: set[str]) -> Path:
    """A real fast tokenizer: whitespace words, unknown words -> [UNK], EOS "</s>"."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", *sorted(words)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="</s>").save_pretrained(path)
    return path


def test_token_lengths_under_the_configured_tokenizer(tmp_path):
    episodes = [episode("a"), episode("bb", answer="Rome"), episode("ccc", answer="New York City")]
    inputs = generate_folder(tmp_path / "gen", {"react": episodes})
    tokenizer = _word_tokenizer(tmp_path / "tok", {"Question:", "Where"})
    stats = run_filter(FilterConfig(inputs=[str(inputs)], out_dir=str(tmp_path / "sft"), tokenizer=str(tokenizer)))
    lengths = sorted(len(render(Trajectory.from_dict(e["trajectory"])).text.split()) + 1 for e in episodes)
    tokens = stats["react"]["tokens"]
    assert (tokens["min"], tokens["p50"], tokens["max"]) == (lengths[0], lengths[1], lengths[2])
    assert tokens["mean"] == round(sum(lengths) / 3, 2) and tokens["tokenizer"] == str(tokenizer)
    with pytest.raises(PipelineError, match="tokenizer"):
        run_filter(FilterConfig(inputs=[str(inputs)], out_dir=str(tmp_path / "sft2"), tokenizer=str(tmp_path / "none")))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", "filter", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cli_exit_codes(tmp_path):
    inputs = generate_folder(tmp_path / "gen", {"react": [episode("a")]})
    config = tmp_path / "exp.yaml"
    config.write_text(f"filter:\n  inputs: [{inputs}]\n  out_dir: {tmp_path / 'sft'}\n")
    proc = _cli("--config", str(config))
    assert proc.returncode == 0, proc.stderr
    assert "react: kept 1 / 1 seen" in proc.stdout
    proc = _cli("--config", str(config), "max_per_methd=3")
    assert proc.returncode == 2 and "did you mean 'max_per_method'" in proc.stderr
    generate_folder(tmp_path / "partial", {"react": [episode("a")]}, complete=False)
    proc = _cli(f"inputs=[{tmp_path / 'partial'}]", f"out_dir={tmp_path / 'sft2'}")
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "incomplete" in proc.stderr
    assert _cli(f"out_dir={tmp_path / 'sft3'}").returncode == 2


@pytest.mark.skipif(not FIREACT.is_dir(), reason="FireAct data not present at ../shared/data/fireact")
def test_cli_from_fireact_dedups_across_files(tmp_path):
    out = tmp_path / "sft"
    proc = _cli("--from-fireact", str(FIREACT / "alpaca_format" / "hotpotqa_multimethod.json"),
                "--from-fireact", str(FIREACT / "gpt_format" / "hotpotqa.jsonl"), f"out_dir={out}", "max_per_method=300")
    assert proc.returncode == 0, proc.stderr
    react = json.loads((out / "react" / "stats.json").read_text())
    assert react["seen"] == 1000 and react["kept"] == 300 and react["dropped"] == {"duplicate": 500, "over_cap": 200}
    cot = json.loads((out / "cot" / "stats.json").read_text())
    assert cot["kept"] == 186 and cot["sources"] == {"fireact:alpaca_format/hotpotqa_multimethod.json": 186}
    rows = read_jsonl(out / "react" / "train.jsonl")
    assert all(r["completion"].endswith("Episode finished, reward = 1\n") for r in rows)
    assert "Google search snippets" in (out / "react" / "README.md").read_text()


def test_rows_are_shuffled_with_the_seed_and_the_card_gives_paper_epochs(tmp_path):
    episodes = [episode(f"q{i:02d}") for i in range(40)]
    first = [e["id"] for e in select("react", episodes, FilterConfig(seed=3)).kept]
    assert first == [e["id"] for e in select("react", episodes, FilterConfig(seed=3)).kept]
    assert sorted(first) == [e["id"] for e in episodes] and first != sorted(first)
    assert first != [e["id"] for e in select("react", episodes, FilterConfig(seed=4)).kept]
    out = tmp_path / "sft"
    run_filter(FilterConfig(inputs=[str(generate_folder(tmp_path / "gen", {"react": episodes}))], out_dir=str(out), seed=3))
    assert [r["id"] for r in read_jsonl(out / "react" / "train.jsonl")] == first
    card = (out / "react" / "README.md").read_text()
    # 4,000 steps x 64 / 40 rows = 6,400 epochs at both size classes
    assert "8B-class students: 6400.0 epochs; 62B-class students: 6400.0 epochs" in card
    assert "shuffled with the seed" in card


def sample(qid: str, j: int, **kwargs) -> dict:
    """Sample j of question qid, as `generate samples=k` records it (pipeline.sampling)."""
    return {**episode(qid, **kwargs), "id": f"{qid}#{j}", "question_id": qid, "sample": j}


def test_samples_of_one_question_keep_their_distinct_correct_trajectories():
    episodes = [sample("a", 0), sample("a", 1), sample("a", 2, answer="paris"),  # 1 repeats 0's trajectory
                sample("a", 3, em=0.0), sample("b", 0, answer="PARIS")]
    kept = select("react", episodes, FilterConfig(shuffle=False))
    assert [e["id"] for e in kept.kept] == ["a#0", "a#2", "b#0"]
    assert dict(kept.dropped) == {"duplicate": 1, "incorrect": 1}
    one = select("react", episodes, FilterConfig(shuffle=False, per_question=1))
    assert [e["id"] for e in one.kept] == ["a#0", "b#0"] and one.dropped["over_per_question"] == 1


def test_failed_episodes_are_kept_beside_the_dataset_with_why(tmp_path):
    errored = {**episode("e", finished=False), "end_reason": "llm_error: HTTP 500"}
    inputs = generate_folder(tmp_path / "gen", {"react": [
        episode("a"), episode("b", em=0.0), episode("c", finished=False), errored, episode("b", em=0.0)]})
    stats = run_filter(FilterConfig(inputs=[str(inputs)], out_dir=str(tmp_path / "sft")))
    failed = read_jsonl(tmp_path / "sft" / "react" / "failed.jsonl")
    assert [(r["id"], r["why"], r["end_reason"]) for r in failed] == [
        ("b", "incorrect", "finish"), ("c", "unfinished", "step_limit"), ("e", "error", "llm_error: HTTP 500")]
    expected = render(Trajectory.from_dict(episode("b", em=0.0)["trajectory"]))
    assert failed[0]["prompt"] == expected.prompt and failed[0]["completion"] == expected.completion
    assert failed[0]["prediction"] == "Paris" and failed[0]["gold_answer"] == "Paris"
    assert stats["react"]["failed"] == {"incorrect": 1, "unfinished": 1, "error": 1}
    assert stats["react"]["dropped"] == {"incorrect": 2, "unfinished": 1, "error": 1}
    assert "failed.jsonl" in (tmp_path / "sft" / "react" / "README.md").read_text()


def test_a_union_starts_from_the_earlier_dataset_and_adds_only_new_trajectories(tmp_path):
    first = generate_folder(tmp_path / "gen1", {"react": [episode("a"), episode("b")]})
    run_filter(FilterConfig(inputs=[str(first)], out_dir=str(tmp_path / "sft1")))
    second = generate_folder(tmp_path / "gen2", {"react": [sample("a", 0), sample("a", 1, answer="paris"),
                                                           sample("c", 0), sample("c", 1, em=0.0)]})
    cfg = FilterConfig(inputs=[str(second)], out_dir=str(tmp_path / "sft2"), union_with=[str(tmp_path / "sft1")])
    stats = run_filter(cfg)
    rows = read_jsonl(tmp_path / "sft2" / "react" / "train.jsonl")
    # a#0 is round 1's "a" again (same text): not added twice; a#1 and c#0 are new
    assert sorted(r["id"] for r in rows) == ["a", "a#1", "b", "c#0"]
    assert stats["react"]["union"] == {"datasets": [str(tmp_path / "sft1")], "rows_from_them": 2, "new_rows": 2}
    assert stats["react"]["kept"] == 4 and stats["react"]["failed"] == {"incorrect": 1}
    assert "A union: the 2 rows of" in (tmp_path / "sft2" / "react" / "README.md").read_text()
    # the earlier dataset is an input: rebuilt when it changes, skipped while it does not
    assert run_filter(cfg)["react"]["kept"] == 4
    run_filter(FilterConfig(inputs=[str(first)], out_dir=str(tmp_path / "sft1"), max_per_method=1))
    assert run_filter(cfg)["react"]["union"]["rows_from_them"] == 1


def test_the_old_key_methods_names_formats(tmp_path):
    """`methods` of filter meant the training formats to build: renamed `formats`."""
    from pipeline.core.config import load_config

    (tmp_path / "f.yaml").write_text("filter:\n  methods: [react]\n")
    with pytest.raises(PipelineError, match=r"unknown key 'methods'; it was renamed: use 'formats'"):
        load_config(FilterConfig, tmp_path / "f.yaml", section="filter")
    with pytest.raises(PipelineError, match=r"unknown key 'methods'; it was renamed: use 'formats'"):
        load_config(FilterConfig, None, ["methods=[react]"])
    assert load_config(FilterConfig, None, ["formats=[react]"]).formats == ["react"]


def test_equal_rows_caps_every_format_by_the_seeded_draw_to_the_smallest_formats_count(tmp_path, capsys):
    react = [episode(f"q{i:02d}") for i in range(10)]
    act = [episode(f"q{i:02d}", "act") for i in range(6)]
    cot = [episode(f"q{i:02d}", "cot") for i in range(4)] + [episode("q09", "cot", em=0.0)]
    inputs = generate_folder(tmp_path / "gen", {"react": react, "act": act, "cot": cot})
    cfg = FilterConfig(inputs=[str(inputs)], out_dir=str(tmp_path / "sft"), equal_rows=True, seed=5)
    stats = run_filter(cfg)
    assert {m: s["kept"] for m, s in stats.items()} == {"cot": 4, "act": 4, "react": 4}
    assert stats["react"]["equal_rows"] == {"rows": 4, "smallest": ["cot"], "kept_before": 10}
    assert stats["react"]["dropped"] == {"over_equal_rows": 6} and stats["cot"]["dropped"] == {"incorrect": 1}
    # the filter's seeded draw: the rows select() keeps under the same cap and seed
    drawn = select("react", react, FilterConfig(seed=5), rows_cap=4).kept
    assert [r["id"] for r in read_jsonl(tmp_path / "sft" / "react" / "train.jsonl")] == [e["id"] for e in drawn]
    manifest = read_manifest(tmp_path / "sft" / "manifest.json")
    assert manifest["equal_rows"] == {"rows": 4, "smallest": ["cot"]}
    assert read_manifest(tmp_path / "sft" / "react" / "manifest.json")["settings"]["equal_rows_cap"] == 4
    assert "equal_rows: 4 rows each (the smallest: cot; 10 here before)" in capsys.readouterr().out
    assert "then 4 (equal_rows: every format as many as the smallest, cot)" in (tmp_path / "sft" / "act" / "README.md").read_text()
    # the cap is part of what makes a dataset the same: without cot the smallest is act's 6
    assert run_filter(FilterConfig(**{**vars(cfg), "formats": ["react", "act"]}))["react"]["kept"] == 6
    # and a dataset built without the key is still up to date once it exists (no rebuild for the new key)
    plain = FilterConfig(inputs=[str(inputs)], out_dir=str(tmp_path / "plain"))
    run_filter(plain)
    assert "equal_rows" not in read_manifest(tmp_path / "plain" / "react" / "manifest.json")["settings"]


@pytest.mark.parametrize(("settings", "why"), [
    ({"formats": ["react"]}, "formats names one format: nothing to make equal"),
    ({"union_with": ["elsewhere"]}, "union_with adds each format's earlier rows"),
    ({"match_dataset": "elsewhere"}, "match_dataset already gives each format that dataset's row count"),
    ({"formats": ["react", "cot"]}, r"cot kept no episode, so every format would get 0 rows; leave cot out"),
    ({"inputs_react_only": True}, r"the inputs hold one format \(react\): nothing to make equal"),
])
def test_equal_rows_is_refused_in_one_line_where_it_cannot_apply_and_writes_nothing(tmp_path, settings, why):
    only = settings.pop("inputs_react_only", False)
    folders = {"react": [episode("a"), episode("b")]} if only else {"react": [episode("a")], "cot": [episode("a", "cot", em=0.0)]}
    inputs = generate_folder(tmp_path / "gen", folders)
    out = tmp_path / "sft"
    proc = _cli(f"inputs=[{inputs}]", f"out_dir={out}", "equal_rows=true",
                *[f"{k}=[{','.join(v)}]" if isinstance(v, list) else f"{k}={v}" for k, v in settings.items()])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert re.search(r"^error: filter: equal_rows.*" + why, proc.stderr) and proc.stderr.count("\n") == 1, proc.stderr
    assert not out.exists() or not any(out.iterdir())


def test_match_dataset_keeps_the_same_questions_at_most_as_many_rows_of_each(tmp_path, capsys):
    """Another teacher's data on the questions a dataset's rows answer: its samples `a#0`, `a#1`
    (two rows of a), `b#0`, `c#0`; this teacher solved a (one trajectory), c, d, not b."""
    teacher = generate_folder(tmp_path / "gen-teacher", {"react": [
        sample("a", 0), sample("a", 1, answer="paris"), sample("b", 0), sample("c", 0), sample("e", 0, em=0.0)]})
    run_filter(FilterConfig(inputs=[str(teacher)], out_dir=str(tmp_path / "sft")))
    oracle = generate_folder(tmp_path / "gen-oracle", {"react": [
        episode("a", note=" o"), episode("b", em=0.0), episode("c", note=" o"), episode("d", note=" o"), episode("e")]})
    cfg = FilterConfig(inputs=[str(oracle)], out_dir=str(tmp_path / "sft-oracle"), match_dataset=str(tmp_path / "sft"))
    stats = run_filter(cfg)["react"]
    assert sorted(r["id"] for r in read_jsonl(tmp_path / "sft-oracle" / "react" / "train.jsonl")) == ["a", "c"]
    assert stats["dropped"] == {"incorrect": 1, "other_question": 2}
    assert stats["matched"] == {"dataset": str(tmp_path / "sft"), "its_rows": 4, "its_questions": 3, "rows": 2,
                                "questions": 2, "questions_unsolved": 1, "rows_short": 2}
    assert read_manifest(tmp_path / "sft-oracle" / "react" / "manifest.json")["matched"] == stats["matched"]
    assert "2 of its 4 rows, 2 of its 3 questions (2 rows short: 1 of its questions unsolved here" in capsys.readouterr().out
    # never more of a question than the matched dataset has rows of it
    twice = generate_folder(tmp_path / "gen-twice", {"react": [sample("c", 0, note=" x"), sample("c", 1, note=" y")]})
    again = run_filter(FilterConfig(inputs=[str(twice)], out_dir=str(tmp_path / "sft-twice"), match_dataset=str(tmp_path / "sft")))
    assert again["react"]["kept"] == 1 and again["react"]["dropped"] == {"over_matched": 1}
    # the matched dataset is an input: rebuilt when it changes
    run_filter(FilterConfig(inputs=[str(teacher)], out_dir=str(tmp_path / "sft"), max_per_method=1, seed=1))
    assert run_filter(cfg)["react"]["matched"]["its_rows"] == 1
    with pytest.raises(PipelineError, match=r"match_dataset: SFT dataset .*/sft/cot .*has not run"):
        run_filter(FilterConfig(inputs=[str(generate_folder(tmp_path / "gen-cot", {"cot": [episode("a", "cot")]}))],
                                out_dir=str(tmp_path / "sft-cot"), match_dataset=str(tmp_path / "sft")))
