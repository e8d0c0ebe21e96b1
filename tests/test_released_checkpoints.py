"""Checkpoints trained elsewhere: a tiny Llama (SmolLM2 tokenizer, random weights) saved as a real
full model and as a real PEFT LoRA adapter, neither with our manifest, evaluated in each format
(ours: numbered ReAct, zero-shot; FireAct's: Alpaca wrapper); the released-agent registry; the
offline error for a hub id that is not cached.

    .venv/bin/python -m pytest tests/test_released_checkpoints.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from episode_testdata import CORPUS, read_records, run_pipeline, write_questions

from pipeline.core.errors import PipelineError

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")


@pytest.fixture(scope="module")
def questions():
    from pipeline.tasks.hotpotqa.questions import load_question_set

    return load_question_set("offline-eval", limit=2)


@pytest.fixture(scope="module")
def question_file(tmp_path_factory, questions):
    return write_questions(tmp_path_factory.mktemp("q") / "questions.jsonl", questions)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """{base, full, adapter}: a tiny Llama saved as a full model (the base), a second full model
    standing for a fine-tuned release, and a LoRA adapter on the base whose adapter_config.json
    names the base folder. No manifest.json anywhere."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from pipeline.hub.smollm2 import local_smollm2_dir

    root = tmp_path_factory.mktemp("released")
    tokenizer = AutoTokenizer.from_pretrained(local_smollm2_dir())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=1024,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    paths = {}
    for name in ("base", "full"):
        paths[name] = root / name
        LlamaForCausalLM(config).save_pretrained(paths[name])
        tokenizer.save_pretrained(paths[name])
    base = AutoModelForCausalLM.from_pretrained(paths["base"])
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                           task_type="CAUSAL_LM", init_lora_weights=False))
    paths["adapter"] = root / "my-agent-lora"
    lora.save_pretrained(paths["adapter"])
    tokenizer.save_pretrained(paths["adapter"])
    paths["params_b"] = sum(p.numel() for p in LlamaForCausalLM(config).parameters()) / 1e9
    assert json.loads((paths["adapter"] / "adapter_config.json").read_text())["base_model_name_or_path"] == \
        str(paths["base"])
    assert not any(p.name == "manifest.json" for p in root.rglob("*"))
    return paths


def one_error_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


# -- resolution -----------------------------------------------------------------------------------


def test_an_adapter_names_its_base_and_a_full_model_counts_its_size(tiny):
    from pipeline.hub.finetuned import resolve_finetuned

    adapter = resolve_finetuned(str(tiny["adapter"]), format="fireact")
    assert (adapter.model, adapter.adapter) == (str(tiny["base"]), str(tiny["adapter"]))
    assert (adapter.trained_format, adapter.decode_style) == ("react", "fireact")
    assert adapter.label == "my-agent-lora (released)"
    assert adapter.params_b == pytest.approx(tiny["params_b"])  # the base's parameters, from its config
    full = resolve_finetuned(str(tiny["full"]), format="react", size_class="tiny")
    assert (full.model, full.adapter, full.decode_style, full.size_class) == (str(tiny["full"]), None, "zero_shot", "tiny")
    override = resolve_finetuned(str(tiny["adapter"]), format="react", base_model=str(tiny["full"]), params_b=7.0)
    assert override.model == str(tiny["full"]) and override.params_b == 7.0


def test_a_local_copy_of_a_registered_agent_needs_nothing_else(tiny, tmp_path):
    import shutil

    from pipeline.hub.finetuned import resolve_finetuned
    from pipeline.hub.released import AGENTS

    copy = tmp_path / "fireact_llama_2_7b_lora"
    shutil.copytree(tiny["adapter"], copy)
    ckpt = resolve_finetuned(str(copy))
    agent = AGENTS["forestai/fireact_llama_2_7b_lora"]
    assert (ckpt.format, ckpt.label, ckpt.params_b, ckpt.size_class) == ("fireact", agent.label, 6.74, "7b")
    assert ckpt.model == str(tiny["base"])  # its adapter_config.json names an existing folder: that wins
    config = json.loads((copy / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "/home/someone/llama-2-7b-chat-hf"  # a trainer's own path
    (copy / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(PipelineError, match="meta-llama/Llama-2-7b-chat-hf"):  # the registry's base, not cached
        resolve_finetuned(str(copy))


def test_the_registry_lists_fireact_and_agentlm_with_base_format_and_size():
    from pipeline.hub.finetuned import DECODE_FORMATS, NOT_IMPLEMENTED
    from pipeline.hub.released import AGENTS

    assert {"forestai/fireact_llama_2_7b_lora", "forestai/fireact_llama_2_13b_lora", "THUDM/agentlm-7b",
            "THUDM/agentlm-13b", "THUDM/agentlm-70b"} <= set(AGENTS)
    for agent in AGENTS.values():
        assert agent.format in DECODE_FORMATS or agent.format in NOT_IMPLEMENTED
        assert agent.params_b > 1 and agent.size_class.endswith("b") and agent.source
    assert AGENTS["forestai/fireact_llama_2_13b_lora"].base_model == "meta-llama/Llama-2-13b-chat-hf"
    assert not AGENTS["THUDM/agentlm-70b"].adapter


@pytest.mark.parametrize("args,message", [
    (["finetuned=forestai/fireact_llama_2_7b_lora"],
     "adapter forestai/fireact_llama_2_7b_lora (LocalEntryNotFoundError"),
    (["finetuned=forestai/fireact_llama_2_7b_lora"], "base model meta-llama/Llama-2-7b-chat-hf"),
    (["finetuned=forestai/fireact_llama_2_7b_lora"],
     "`hf download forestai/fireact_llama_2_7b_lora --local-dir <finetuned-dir>` and pass finetuned="),
    (["finetuned=THUDM/agentlm-7b"], "format 'agentlm' is not supported"),
    (["finetuned={adapter}"], "set format=<standard|cot|act|react|fireact>"),
    (["finetuned={adapter}", "format=fireact", "methods=[cot]"], "it cannot run cot"),
    (["finetuned={adapter}", "format=chat"], "format 'chat' is unknown"),
    (["finetuned=/nonexistent/agent", "format=react"], "no such folder"),
    (["format=fireact"], "set finetuned= too"),
])
def test_bad_or_unreachable_checkpoints_are_one_line_errors(tiny, tmp_path, index, question_file, args, message):
    out = tmp_path / "out"
    args = [a.replace("{adapter}", str(tiny["adapter"])) for a in args]
    offline = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}  # an empty cache, no network
    proc = run_pipeline("eval", *args, f"questions={question_file}", f"wiki.index={index}", f"out_dir={out}",
                        "size_class=7b", env=offline)
    line = one_error_line(proc)
    assert message in line, line
    assert not out.exists()


# -- evaluation through transformers, each format --------------------------------------------------


@pytest.mark.parametrize("kind,fmt", [("adapter", "fireact"), pytest.param("full", "react", marks=pytest.mark.slow),
                                      pytest.param("adapter", "react", marks=pytest.mark.slow),
                                      pytest.param("full", "fireact", marks=pytest.mark.slow)])
def test_a_checkpoint_without_our_manifest_is_evaluated_in_its_format(tiny, tmp_path, index, question_file,
                                                                       kind, fmt):
    out = tmp_path / "eval"
    proc = run_pipeline("eval", f"finetuned={tiny[kind]}", f"format={fmt}", "model.device=cpu",
                        "prompting.max_new_tokens=4", f"questions={question_file}", f"wiki.index={index}",
                        f"out_dir={out}", timeout=300)
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads((out / "summary.json").read_text())
    label = f"{Path(tiny[kind]).name} (released)"
    assert (row["model"], row["mode"], row["method"], row["n"]) == (label, "finetune", "react", 2)
    assert row["released"] == {"finetuned": str(tiny[kind]), "format": fmt}
    assert row["params_b"] == pytest.approx(tiny["params_b"])
    records = read_records(out / "react.jsonl")
    assert len(records) == 2 and all(r["teacher"] == label and r["completion_tokens"] > 0 for r in records)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["config"]["format"] == fmt


def test_the_prompts_a_released_checkpoint_receives(tiny, tmp_path, index, questions, question_file, monkeypatch):
    """In process, with a scripted model standing in for the loaded checkpoint: FireAct's format
    sends the Alpaca-wrapped question then `Thought:`; ours sends the question line then `Thought 1:`;
    the model the eval opens is the adapter on the base its adapter_config.json names."""
    from pipeline.agent import answerers
    from pipeline.core.config import build
    from pipeline.core.trajectory import one_line
    from pipeline.llm.scripted import ScriptedLLM
    from pipeline.methods.fireact import alpaca_prompt
    from pipeline.stages.eval import EvalConfig, evaluate

    cases = {"fireact": (" I answer.\nAction: finish[nothing]", lambda q: alpaca_prompt(q.question) + "Thought:"),
             "react": (" I answer.\nAction 1: Finish[nothing]", lambda q: f"Question: {one_line(q.question)}\nThought 1:")}
    for fmt, (reply, first_prompt) in cases.items():
        opened = []

        def scripted(model, max_in_flight, reply=reply, opened=opened):  # PromptedModel.open, with a scripted stand-in
            opened.append((model.cfg, ScriptedLLM(lambda prompt, req: reply, name=model.cfg.label)))
            return opened[-1][1]

        monkeypatch.setattr(answerers.PromptedModel, "open", scripted)
        out = tmp_path / fmt
        cfg = build(EvalConfig, {"finetuned": str(tiny["adapter"]), "format": fmt, "questions": str(question_file),
                                 "wiki": {"index": str(index)}, "out_dir": str(out)})
        [row] = evaluate(cfg)
        [(llm_cfg, llm)] = opened
        assert (llm_cfg.model, llm_cfg.adapter) == (str(tiny["base"]), str(tiny["adapter"]))
        assert sorted(llm.prompts) == sorted(first_prompt(q) for q in questions)
        records = read_records(out / "react.jsonl")
        assert [r["end_reason"] for r in records] == ["finish", "finish"]
        assert (row["em"], row["finish_rate"], row["released"]["format"]) == (0.0, 1.0, fmt)


# -- plotting -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["finetuned", "checkpoint"])  # checkpoint: a row written before the rename
def test_a_released_checkpoint_is_plotted_as_its_own_labelled_point(tmp_path, key):
    from pipeline.report.figure import draw_figure
    from pipeline.report.summaries import load_summaries
    from pipeline.stages.plot import PlotConfig, run_plot

    def row(model, mode, method, em, **extra):
        return {"model": model, "size_class": "7b", "params_b": 7.0, "mode": mode, "method": method,
                "question_set": "offline-eval", "n": 100, "em": em, "f1": em, **extra}

    ours = [row("ours-7b", mode, m, em) for mode in ("prompt", "finetune")
            for m, em in zip(("standard", "cot", "act", "react"), (0.2, 0.25, 0.1, 0.3), strict=True)]
    released = row("FireAct Llama-2-7B LoRA (released)", "finetune", "react", 0.9,
                   released={key: "forestai/fireact_llama_2_7b_lora", "format": "fireact"})
    paths = []
    for name, rows in (("ours", ours), ("released", [released])):
        paths.append(tmp_path / name / "summary.json")
        paths[-1].parent.mkdir()
        paths[-1].write_text(json.dumps(rows))
    with_released = run_plot(PlotConfig(summaries=[str(p) for p in paths], out_dir=str(tmp_path / "a"),
                                        reference_points=False))
    without = run_plot(PlotConfig(summaries=[str(paths[0])], out_dir=str(tmp_path / "b"), reference_points=False))
    # not judged: the orderings read the same with and without it (it would make ReAct best at 7b)
    assert with_released["orderings"].read_text() == without["orderings"].read_text()
    assert "FireAct Llama-2-7B LoRA (released) (7b)" in with_released["md"].read_text()
    fig = draw_figure(load_summaries([str(p) for p in paths]), [], "t")
    tuned = fig.axes[1]
    assert [t.get_text() for t in tuned.texts] == ["FireAct Llama-2-7B LoRA (released)"]
    react_line = next(line for line in tuned.get_lines() if line.get_color() == "#d62728")
    assert list(react_line.get_ydata()) == [30.0]  # our student only: the released point is not on the line
    assert "released fine-tuned agent, evaluated here" in [t.get_text() for t in fig.legends[0].get_texts()]


# -- a `finetuned:` student in a run grid ---------------------------------------------------------


def checkpoint_grid(tmp_path: Path, index: Path, tiny: dict) -> tuple:
    from pipeline.core.config import build
    from pipeline.stages.run import RunConfig, Student

    cfg = build(RunConfig, {
        "experiment": "released", "out_dir": str(tmp_path / "run"), "formats": ["react"],
        "wiki": {"index": str(index)},
        "eval": {"questions": "offline-eval", "limit": 2, "model": {"device": "cpu"},
                 "prompting": {"max_new_tokens": 4}},
        "plot": {"reference_points": False},
    })
    students = [build(Student, s) for s in (
        {"name": "agent-lora", "finetuned": str(tiny["adapter"]), "format": "fireact"},
        {"name": "agent-full", "finetuned": str(tiny["full"]), "format": "react", "size_class": "tiny"},
    )]
    return cfg, students


def test_a_checkpoint_student_plans_an_eval_and_no_training(tmp_path, index, tiny):
    from pipeline.stages.run import plan

    cfg, students = checkpoint_grid(tmp_path, index, tiny)
    units = plan(cfg, students)
    assert [u.title.split(":")[0] for u in units] == ["eval", "eval", "plot"]  # no generate/filter/train
    lora = units[0].config
    assert (str(lora.finetuned), lora.format, lora.out_dir.name) == (str(tiny["adapter"]), "fireact",
                                                                     "agent-lora-checkpoint")


@pytest.mark.parametrize("student,message", [
    ({"name": "x", "finetuned": "a/b", "config": "configs/students/tiny.yaml"}, "drop `config`/`train`"),
    ({"name": "x", "format": "fireact", "config": "c.yaml", "size_class": "7b", "params_b": 7}, "describes a `finetuned` model"),
    ({"name": "x", "config": "c.yaml"}, "set size_class, params_b"),
    ({"name": "x", "size_class": "7b", "params_b": 7}, "set config"),
])
def test_bad_students_fail_before_anything_runs(tmp_path, index, tiny, student, message):
    from pipeline.core.config import build
    from pipeline.stages.run import Student, plan

    cfg, _ = checkpoint_grid(tmp_path, index, tiny)
    with pytest.raises(PipelineError, match=message.replace("`", ".").replace("/", ".")):
        plan(cfg, [build(Student, student)])


def test_a_grid_of_already_fine_tuned_students_is_evaluated_and_plotted(tmp_path, index, tiny):
    from pipeline.stages.run import run

    cfg, students = checkpoint_grid(tmp_path, index, tiny)
    outputs = run(cfg, students)
    table = outputs["md"].read_text()
    for label in ("my-agent-lora (released)", "full (released)"):
        assert label in table
    rows = [json.loads((tmp_path / "run" / "eval" / f"{n}-checkpoint" / "summary.json").read_text())[0]
            for n in ("agent-lora", "agent-full")]
    assert [(r["released"]["format"], r["mode"], r["n"]) for r in rows] == [("fireact", "finetune", 2),
                                                                            ("react", "finetune", 2)]
    assert not (tmp_path / "run" / "sft").exists() and not (tmp_path / "run" / "generate").exists()
