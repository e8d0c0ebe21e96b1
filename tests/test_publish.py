"""`publish`: an SFT dataset becomes a `datasets`-loadable folder with its card; a checkpoint a
`from_pretrained`-loadable folder with its model card (training config, data provenance, EM/F1);
the upload goes through huggingface_hub's HfApi when a hub id and a token are there.

    .venv/bin/python -m pytest tests/test_publish.py -q
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from episode_testdata import CORPUS, run_pipeline

from pipeline.core.errors import PipelineError
from pipeline.stages.publish import PublishConfig, publish

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")


@pytest.fixture(scope="module")
def sft(tmp_path_factory, index, shared_data) -> Path:
    """A real SFT dataset: the oracle stand-in teacher's ReAct and CoT episodes through the local
    index, plus FireAct's released ReAct trajectories, filtered with token counts."""
    from pipeline.core.config import build
    from pipeline.stages.filter import FilterConfig, run_filter
    from pipeline.stages.generate import GenerateConfig, generate

    root = tmp_path_factory.mktemp("pub")
    generate(build(GenerateConfig, {"oracle": "exact", "methods": ["react", "cot"], "limit": 6,
                                    "out_dir": str(root / "gen"), "wiki": {"index": str(index)}}))
    run_filter(build(FilterConfig, {"inputs": [str(root / "gen")], "out_dir": str(root / "sft"),
                                    "fireact": [str(shared_data / "fireact" / "alpaca_format" / "hotpotqa.json")],
                                    "tokenizer": "smollm2"}))
    return root / "sft"


def test_a_dataset_is_loadable_with_its_card(sft, tmp_path, monkeypatch):
    from datasets import load_dataset

    monkeypatch.delenv("HF_TOKEN", raising=False)
    result = publish(PublishConfig(dataset=str(sft), out_dir=str(tmp_path)))
    folder = result["folder"]
    assert result["url"] is None and folder.name == "hotpotqa-react-sft-cot-react"
    stats = {m: json.loads((sft / m / "stats.json").read_text()) for m in ("cot", "react")}
    for method in ("cot", "react"):
        ds = load_dataset(str(folder), method)
        assert ds["train"].num_rows == stats[method]["kept"] > 0
        assert set(ds["train"].column_names) >= {"prompt", "completion", "observation_spans", "source"}
    assert stats["react"]["kept"] > 500  # FireAct's 500 plus the oracle's
    card = (folder / "README.md").read_text()
    for text in ("license: \"cc-by-sa-4.0\"", "config_name: react", "path: react/train.jsonl",
                 "| react | ", "oracle", "gpt-4 (FireAct release)",  # teachers: generate manifest, FireAct import
                 "exact match 1", "at most 3000 per method", "(seed 0)",
                 f"{stats['react']['tokens']['p50']} / {stats['react']['tokens']['p95']}", "smollm2",
                 "HotpotQA (Yang et al. 2018): questions and answers, CC BY-SA 4.0", "Wikipedia",
                 "CC BY-SA", "Google search snippets"):
        assert text in card, text
    assert not any(p.name == "manifest.json" for p in folder.rglob("*"))


def test_a_dataset_manifest_written_before_the_rename_still_names_its_format(tmp_path):
    """A filter manifest names its folder's format `format`; one written before the rename `method`."""
    from pipeline.core.storage import write_manifest
    from pipeline.hub.cards import dataset_facts

    for folder, key in ((tmp_path / "old", "method"), (tmp_path / "new", "format")):
        folder.mkdir()
        write_manifest(folder / "manifest.json", stage="filter", config={}, complete=True, task="hotpotqa",
                       **{key: "cot"})
        assert dataset_facts(folder)["format"] == "cot"  # not the folder's name


@pytest.fixture(scope="module")
def finals(tmp_path_factory, sft) -> dict[str, Path]:
    """Two of our `final/` folders (manifest as pipeline/finetune.py writes it, real tiny weights):
    a full model and a LoRA adapter on a saved tiny base; plus an eval summary of the full one."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from pipeline.core.storage import atomic_write_json, write_manifest
    from pipeline.hub.smollm2 import local_smollm2_dir

    root = tmp_path_factory.mktemp("finals")
    tokenizer = AutoTokenizer.from_pretrained(local_smollm2_dir())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512)
    out = {"base": root / "base", "full": root / "full" / "final", "lora": root / "lora" / "final"}
    for name in ("base", "full"):
        LlamaForCausalLM(config).save_pretrained(out[name])
        tokenizer.save_pretrained(out[name])
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(out["base"]),
                          LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    lora.save_pretrained(out["lora"])
    tokenizer.save_pretrained(out["lora"])
    for name, adapter in (("full", False), ("lora", True)):
        write_manifest(out[name] / "manifest.json", stage="train", complete=True,
                       config={"learning_rate": 2e-5, "lr_scheduler": "cosine", "warmup_ratio": 0.03, "seed": 0,
                               "precision": "auto", "lora": {"r": 4}},
                       student="tiny-llama", base_model=str(out["base"]), init="pretrained", adapter=adapter,
                       finetuning="lora" if adapter else "full", method="react", size_class="tiny", steps=4,
                       max_steps=4, global_batch_size=8, per_device_batch_size=8, gradient_accumulation_steps=1,
                       num_processes=1, mask_observations=False, params_b=0.0001, train_loss=2.5, seconds=12.0,
                       dataset={"path": str(sft / "react" / "train.jsonl"), "examples": 510})
    evals = root / "eval"
    for name, em in (("full", 0.25), ("other", 0.75)):
        write_manifest(evals / name / "manifest.json", stage="eval", complete=True,
                       config={"finetuned": str(out["full"] if name == "full" else out["lora"])})
        atomic_write_json(evals / name / "summary.json", [{
            "model": "tiny-llama (fine-tuned)", "size_class": "tiny", "params_b": 0.0001, "mode": "finetune",
            "method": "react", "question_set": "offline-eval", "n": 4, "em": em, "f1": em + 0.1,
            "finish_rate": 0.5}])
    out["summaries"] = evals
    return out


def test_eval_manifests_written_before_the_rename_still_give_a_card_its_rows(tmp_path):
    """An eval manifest's config named the model it evaluated `checkpoint` before `finetuned`: both
    are read; a summary of another model is not this one's."""
    from pipeline.core.storage import atomic_write_json, write_manifest
    from pipeline.hub.cards import eval_rows_for

    final, other = tmp_path / "final", tmp_path / "other"
    summaries = []
    for name, key, model in (("old", "checkpoint", final), ("new", "finetuned", final), ("else", "finetuned", other)):
        write_manifest(tmp_path / name / "manifest.json", stage="eval", complete=True, config={key: str(model)})
        atomic_write_json(tmp_path / name / "summary.json", [{"method": "react", "run": name}])
        summaries.append(tmp_path / name / "summary.json")
    assert [r["run"] for r in eval_rows_for(final, summaries)] == ["old", "new"]


def test_a_full_checkpoint_is_loadable_and_its_card_has_config_provenance_and_results(finals, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = publish(PublishConfig(checkpoint=str(finals["full"]), out_dir=str(tmp_path),
                                   summaries=[str(finals["summaries"] / "*" / "summary.json")]))
    folder = result["folder"]
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.hidden_size == 32 and AutoTokenizer.from_pretrained(folder).eos_token
    card = (folder / "README.md").read_text()
    for text in ("library_name: \"transformers\"", "# tiny-llama fine-tuned on react trajectories",
                 "| react | offline-eval | 4 | 25.0 | 35.0 | 50.0 |",  # its own eval only (not the 75.0 one)
                 "| learning rate | 2e-05 (cosine, warmup ratio 0.03) |", "| steps | 4 of 4 |",
                 "8 = 8 per device x 1 accumulation x 1 processes", "Teacher: oracle; gpt-4 (FireAct release)",
                 "exact match 1", "CC BY-SA 4.0", "python -m pipeline eval finetuned=<this folder> methods=[react]",
                 "Full training config"):
        assert text in card, text
    assert "75.0" not in card


def test_an_adapter_checkpoint_is_loadable_on_its_base(finals, tmp_path):
    from peft import AutoPeftModelForCausalLM

    folder = publish(PublishConfig(checkpoint=str(finals["lora"]), out_dir=str(tmp_path), name="tiny-lora"))["folder"]
    model = AutoPeftModelForCausalLM.from_pretrained(folder)
    assert model.peft_config["default"].r == 4
    card = (folder / "README.md").read_text()
    assert "library_name: \"peft\"" in card and "A LORA adapter on" in card and "Not evaluated yet" in card


def test_the_card_train_leaves_in_final_is_the_card_publish_writes(finals, tmp_path):
    """`run` rewrites final/README.md after evaluating it; publish writes the same text."""
    from pipeline.hub.cards import eval_rows_for, write_model_card

    summary = finals["summaries"] / "full" / "summary.json"
    write_model_card(finals["full"], eval_rows_for(finals["full"], [summary]))
    folder = publish(PublishConfig(checkpoint=str(finals["full"]), out_dir=str(tmp_path),
                                   summaries=[str(summary)]))["folder"]
    assert (folder / "README.md").read_text() == (finals["full"] / "README.md").read_text()


class RecordingHfApi:
    """A stand-in for huggingface_hub.HfApi: records create_repo / upload_folder calls instead of
    talking to the hub (no network here). Each call is checked against the real HfApi signature."""

    def __init__(self, fail: bool = False):
        self.calls, self.fail = [], fail

    def create_repo(self, repo_id, **kwargs):
        from huggingface_hub import HfApi

        inspect.signature(HfApi.create_repo).bind(None, repo_id, **kwargs)
        self.calls.append(("create_repo", repo_id, kwargs))
        if self.fail:
            raise ConnectionError("hub unreachable")

    def upload_folder(self, **kwargs):
        from huggingface_hub import HfApi

        inspect.signature(HfApi.upload_folder).bind(None, **kwargs)
        self.calls.append(("upload_folder", kwargs["repo_id"], kwargs))
        return type("CommitInfo", (), {"commit_url": f"https://huggingface.co/{kwargs['repo_id']}/commit/abc"})()


def test_upload_creates_the_repo_and_uploads_the_folder_when_a_token_is_set(sft, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    api = RecordingHfApi()
    result = publish(PublishConfig(dataset=str(sft / "react"), out_dir=str(tmp_path), hub_id="me/react-sft"), api=api)
    [(create, repo, create_kwargs), (upload, repo2, upload_kwargs)] = api.calls
    assert (create, repo, create_kwargs) == ("create_repo", "me/react-sft",
                                             {"repo_type": "dataset", "private": True, "exist_ok": True})
    assert (upload, repo2, upload_kwargs["repo_type"]) == ("upload_folder", "me/react-sft", "dataset")
    assert upload_kwargs["folder_path"] == str(result["folder"]) and (result["folder"] / "react" / "train.jsonl").is_file()
    assert result["url"] == "https://huggingface.co/me/react-sft/commit/abc"


@pytest.mark.parametrize("env,hub_id,reason", [
    ({}, "me/x", "not uploaded: no token in $HF_TOKEN"),
    ({"HF_TOKEN": "t"}, None, "not uploaded: no hub_id configured"),
    ({"HF_TOKEN": "t", "HF_HUB_OFFLINE": "1"}, "me/x", "not uploaded: HF_HUB_OFFLINE is set"),
])
def test_without_token_hub_id_or_network_it_stops_after_the_folder_and_says_so(sft, tmp_path, monkeypatch, capsys,
                                                                              env, hub_id, reason):
    for key in ("HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    api = RecordingHfApi()
    result = publish(PublishConfig(dataset=str(sft / "cot"), out_dir=str(tmp_path), hub_id=hub_id), api=api)
    [line] = capsys.readouterr().out.strip().splitlines()
    assert reason in line and str(result["folder"]) in line
    assert api.calls == [] and (result["folder"] / "README.md").is_file()


def test_a_failed_upload_is_one_error_and_keeps_the_folder(sft, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "t")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(PipelineError, match="uploading to me/x failed .ConnectionError: hub unreachable"):
        publish(PublishConfig(dataset=str(sft / "cot"), out_dir=str(tmp_path), hub_id="me/x"),
                api=RecordingHfApi(fail=True))
    assert (tmp_path / "hotpotqa-react-sft-cot" / "cot" / "train.jsonl").is_file()


@pytest.mark.parametrize("args,message", [
    ([], "give exactly one of dataset="),
    (["dataset={tmp}", "checkpoint={tmp}"], "give exactly one of dataset="),
    (["dataset={tmp}"], "holds no SFT dataset"),
    (["checkpoint={tmp}"], "no manifest at"),
    (["dataset={sft}", "hub_id=no-slash"], "must be <user or org>/<name>"),
])
def test_cli_bad_inputs_exit_2_with_one_line(sft, tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)).replace("{sft}", str(sft)) for a in args]
    proc = run_pipeline("publish", *args, f"out_dir={tmp_path / 'out'}")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_cli_writes_the_folder_and_says_it_did_not_upload(sft, tmp_path):
    proc = run_pipeline("publish", f"dataset={sft}", f"out_dir={tmp_path}", "hub_id=me/x", env={"HF_TOKEN": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == (f"[publish] wrote {tmp_path / 'hotpotqa-react-sft-cot-react'}; "
                                                     "not uploaded: no token in $HF_TOKEN")
