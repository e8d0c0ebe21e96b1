"""The `eval` stage as a real `python -m pipeline eval` process: a prompted model behind the fake
OpenAI-compatible server, fine-tuned checkpoints (zero-shot prompts; a tiny real model through
transformers), resume, and bad inputs (exit 2, one line, nothing written).

    .venv/bin/python -m pytest tests/test_evaluate.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from episode_testdata import (
    CORPUS,
    EPISODE_FIELDS,
    SUMMARY_FIELDS,
    ScriptedTeacher,
    read_records,
    run_pipeline,
    write_questions,
)
from http_servers import FakeOpenAI

from pipeline.core.trajectory import Trajectory, one_line, render

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")


@pytest.fixture(scope="module")
def questions():
    from pipeline.tasks.hotpotqa.questions import load_question_set

    return load_question_set("offline-eval", limit=4)


@pytest.fixture(scope="module")
def question_file(tmp_path_factory, questions):
    return write_questions(tmp_path_factory.mktemp("q") / "eval-questions.jsonl", questions)


def one_error_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def write_checkpoint(folder: Path, *, method: str = "react", adapter: bool = False, complete: bool = True,
                     base_model: str | None = None, **extra) -> Path:
    """A `final` folder's manifest in pipeline/finetune.py's format (weights added by callers)."""
    from pipeline.core.storage import write_manifest

    folder.mkdir(parents=True, exist_ok=True)
    write_manifest(folder / "manifest.json", stage="train", config={}, complete=complete,
                   student="tiny-llama", base_model=base_model, init="random", adapter=adapter,
                   finetuning="lora" if adapter else "full", format=method, size_class="tiny",
                   steps=10, max_steps=10, tokenizer=".", prompt_format="Question: {question}\n",
                   params_b=extra.pop("params_b", 0.0001), **extra)
    return folder


# -- a prompted base model -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def prompted_run(tmp_path_factory, index, questions, question_file):
    out = tmp_path_factory.mktemp("eval") / "prompted"
    wrong = {questions[0].question: "certainly not this"}
    with FakeOpenAI(model="big-model") as server:
        server.replies = ScriptedTeacher(questions, answers=wrong)
        args = ("eval", "model.backend=openai", "model.model=big-model", f"model.base_url={server.url}/v1",
                "size_class=70b", "params_b=70.6", f"questions={question_file}", f"wiki.index={index}",
                f"out_dir={out}", "methods=[standard,cot,act,react,cot_sc]", "prompting.cot_sc_samples=5")
        proc = run_pipeline(*args)
        assert proc.returncode == 0, proc.stderr
        before = {p.name: p.read_bytes() for p in out.glob("*.jsonl")}
        n_requests = len(server.requests)
        again = run_pipeline(*args)  # everything is done: no request, no new record
        assert again.returncode == 0, again.stderr
        assert len(server.requests) == n_requests + 1  # only the endpoint check (/v1/models)
        assert {p.name: p.read_bytes() for p in out.glob("*.jsonl")} == before
    return out, proc


def test_prompted_eval_writes_summary_rows_and_records(prompted_run, questions, question_file):
    out, proc = prompted_run
    rows = json.loads((out / "summary.json").read_text())
    assert [r["method"] for r in rows] == ["standard", "cot", "act", "react", "cot_sc"]
    for row in rows:
        assert set(row) == SUMMARY_FIELDS | {"exemplars"}, set(row) ^ SUMMARY_FIELDS
        assert (row["model"], row["size_class"], row["params_b"], row["mode"], row["source"], row["exemplars"]) == \
            ("big-model", "70b", 70.6, "prompt", "ours", "ours")  # the prompts' exemplars: ours by default
        assert row["question_set"] == str(question_file) and row["n"] == 4
        assert row["em"] == pytest.approx(0.75) and row["f1"] < 1.0  # one question answered wrong
        assert row["finish_rate"] == 1.0 and row["prompt_tokens"] > 0 and row["completion_tokens"] > 0
        assert row["precision"] is None and row["train_precision"] is None  # a served model: not ours to know
    by_method = {r["method"]: r for r in rows}
    assert by_method["react"]["mean_steps"] == 2.0 and by_method["standard"]["mean_steps"] == 0.0
    for method in ("standard", "cot", "act", "react", "cot_sc"):
        records = read_records(out / f"{method}.jsonl")
        assert len(records) == 4 and all(set(r) == EPISODE_FIELDS and r["source"] == "eval" for r in records)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["mode"] == "prompt" and manifest["summary"] == rows
    assert manifest["sampling"] == {"temperature": 0.0, "cot_sc_temperature": 0.7, "top_p": 1.0,
                                    "presence_penalty": 0.0, "frequency_penalty": 0.0}  # sent to a server not vLLM
    assert "big-model [prompt]            react: EM 0.750" in proc.stdout


def test_a_different_model_into_the_same_folder_is_refused(prompted_run, index, question_file):
    out, _ = prompted_run
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    proc = run_pipeline("eval", "model.backend=openai", "model.model=other-model", "size_class=8b",
                        "params_b=8", f"questions={question_file}", f"wiki.index={index}", f"out_dir={out}")
    assert "holds a eval run with a different model" in one_error_line(proc)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# -- fine-tuned checkpoints --------------------------------------------------------------------


def test_a_finetuned_checkpoint_runs_zero_shot_in_its_trained_format(tmp_path, index, questions, question_file):
    """Served by an OpenAI-compatible server under its folder name (as `vllm serve <final>` does),
    so the exact prompts the student receives can be checked: the question line alone, then the
    trajectory so far; no instruction, no exemplars."""
    final = write_checkpoint(tmp_path / "ckpt" / "tiny-llama" / "react" / "final")
    out = tmp_path / "ft"
    with FakeOpenAI(model=str(final)) as server:
        server.replies = ScriptedTeacher(questions)
        proc = run_pipeline("eval", "model.backend=openai", f"model.base_url={server.url}/v1",
                            f"finetuned={final}", f"questions={question_file}", f"wiki.index={index}",
                            f"out_dir={out}", "methods=[react]")
        prompts = server.replies.prompts
    assert proc.returncode == 0, proc.stderr
    records = {r["question"]: r for r in read_records(out / "react.jsonl")}
    assert len(prompts) == 2 * len(questions)
    for q in questions:
        line = f"Question: {one_line(q.question)}\n"
        first, second = [p for p in prompts if p.startswith(line)]
        assert first == line + "Thought 1:"
        traj = Trajectory.from_dict(records[q.question]["trajectory"])
        traj.steps, traj.answer = traj.steps[:1], None
        assert second == render(traj).text + "Thought 2:"
    [row] = json.loads((out / "summary.json").read_text())
    assert (row["model"], row["mode"], row["size_class"], row["params_b"], row["method"]) == \
        ("tiny-llama (fine-tuned)", "finetune", "tiny", 0.0001, "react")
    assert row["em"] == 1.0 and row["n"] == 4


@pytest.fixture(scope="module")
def tiny_final(tmp_path_factory, smollm2_dir):
    """A real tiny Llama (random weights) + the SmolLM2 tokenizer saved as a full-model `final`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, intermediate_size=128, max_position_embeddings=512,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    final = tmp_path_factory.mktemp("ckpt") / "tiny-llama" / "cot" / "final"
    LlamaForCausalLM(config).save_pretrained(final)
    tokenizer.save_pretrained(final)
    return write_checkpoint(final, method="cot")


def test_a_real_tiny_checkpoint_is_evaluated_through_transformers(tiny_final, tmp_path, index, question_file):
    out = tmp_path / "tiny"
    proc = run_pipeline("eval", f"finetuned={tiny_final}", "model.device=cpu", "prompting.max_new_tokens=6",
                        f"questions={question_file}", f"wiki.index={index}", f"out_dir={out}",
                        "methods=[cot,cot_sc]", "prompting.cot_sc_samples=3", timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((out / "summary.json").read_text())
    assert [(r["method"], r["mode"], r["n"], r["model"]) for r in rows] == \
        [("cot", "finetune", 4, "tiny-llama (fine-tuned)"), ("cot_sc", "finetune", 4, "tiny-llama (fine-tuned)")]
    for r in read_records(out / "cot.jsonl"):
        # A random 6-token student: no "Answer:" line, so no answer, with the reason recorded.
        assert r["end_reason"] in ("runaway", "no_action", "finish") and r["completion_tokens"] > 0
        assert r["prompt_tokens"] > 0 and r["teacher"] == "tiny-llama (fine-tuned)"


def test_a_checkpoint_cannot_run_a_format_it_was_not_trained_on(tmp_path, index, question_file):
    final = write_checkpoint(tmp_path / "final", method="react")
    for methods in ("[cot]", "[react_to_cot_sc]"):
        proc = run_pipeline("eval", f"finetuned={final}", f"questions={question_file}", f"wiki.index={index}",
                            f"out_dir={tmp_path / 'out'}", f"methods={methods}")
        assert "trained on 'react' trajectories; it cannot run" in one_error_line(proc)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case,message", [
    ("adapter_without_base", "is a LoRA adapter whose base model '/nonexistent/base-model' is missing"),
    ("incomplete", "says the run that wrote it is incomplete"),
    ("no_manifest", "no manifest at"),
    ("no_format", "names no 'format'"),
])
def test_bad_checkpoints_are_clear_errors(tmp_path, index, question_file, case, message):
    final = tmp_path / "final"
    if case == "adapter_without_base":
        write_checkpoint(final, adapter=True, base_model="/nonexistent/base-model")
        (final / "adapter_config.json").write_text("{}")
    elif case == "incomplete":
        write_checkpoint(final, complete=False)
    elif case == "no_manifest":
        final.mkdir()
    else:
        write_checkpoint(final, method=None)
    proc = run_pipeline("eval", f"finetuned={final}", f"questions={question_file}", f"wiki.index={index}",
                        f"out_dir={tmp_path / 'out'}")
    assert message in one_error_line(proc)
    assert not (tmp_path / "out").exists()


def test_the_embedded_default_model_needs_no_size_keys():
    """`python -m pipeline eval limit=2` with nothing else: the project knows SmolLM2-135M's size."""
    from pipeline.stages.eval import EvalConfig, model_under_test

    target = model_under_test(EvalConfig())
    assert (target.size_class, target.params_b, target.mode) == ("135m", 0.135, "prompt")


@pytest.mark.parametrize("overrides,message", [
    (["model.model=some/unknown-model"], "its size is not known; set size_class=<e.g. 8b> and params_b=<billions"),
    (["model.model=some/unknown-model", "size_class=8b"], "set params_b=<billions"),
    (["size_class=135m", "limit=0"], "'limit' must be >= 1, got 0"),  # was "is empty: nothing to evaluate" (issue 39)
    (["size_class=135m", "questions={empty}"], "file is empty; expected HotpotQA questions"),
    (["size_class=135m", "methods=[]"], "'methods' is empty; name at least one"),
    (["size_class=135m", "methods=[react,sc]"], "unknown method 'sc'"),
    (["size_class=135m", "questions=react-dev501"], "unknown question set 'react-dev501'"),
    (["size_class=135m", "finetunde=x"], "unknown key 'finetunde'; did you mean 'finetuned'?"),
    (["size_class=135m", "checkpoint=x"], "unknown key 'checkpoint'; it was renamed: use 'finetuned'"),
    (["size_class=135m", "max_error_share=1.5"], "'max_error_share' must be >= 0 and <= 1, got 1.5"),  # at the config (issue 60)
])
def test_bad_eval_inputs_exit_2_with_one_line_and_write_nothing(tmp_path, index, overrides, message):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = tmp_path / "out"
    overrides = [o.replace("{empty}", str(empty)) for o in overrides]
    proc = run_pipeline("eval", f"wiki.index={index}", f"out_dir={out}", "limit=2", *overrides)
    line = one_error_line(proc)
    assert message in line, line
    assert not out.exists()
