"""One list of checks, run before anything loads (issue 46, items 6-8): the settings handed to
transformers, TRL and PEFT are checked when the config is built, against the libraries' own lists;
`--dry-run` and `--print-config` refuse what the launch would refuse; names, selections and
devices are checked as values. Each refusal is one line, exit 2, nothing written. The cases run
the real CLI (`python -m pipeline ...`); the class checks (every setting handed to a library
declares its check) run in process.

    .venv/bin/python -m pytest tests/test_preflight.py -n 0 -q
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from episode_testdata import run_pipeline
from sft_testdata import fireact_records, write_dataset
from test_first_use import GRPO_YAML, TINY, refused, stage_configs

from pipeline.core.config import build
from pipeline.core.errors import PipelineError

SITE = Path(__import__("trl").__file__).parents[1]


def nothing_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


@pytest.fixture(scope="module")
def sft(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sft")
    write_dataset(folder, "react", fireact_records(limit=8))
    return folder


# -------------------------------------------------------------------------- item 6: library settings


@pytest.mark.parametrize("override, pattern", [
    ("optim=adamw_nope", r"'optim' must be one of transformers' optimizers \(OptimizerNames\): adamw_torch, .*got 'adamw_nope'"),
    ("lr_scheduler=cosinee", r"'lr_scheduler' must be one of transformers' schedulers .*got 'cosinee'; did you mean 'cosine'\?"),
    ("report_to=nonsense", r"'report_to' must be one of transformers' logging integrations: none, .*tensorboard"),
    ("learning_rate=-1", r"'learning_rate' must be > 0, got -1.0$"),
    ("warmup_ratio=2", r"'warmup_ratio' must be >= 0 and <= 1, got 2.0$"),
    ("max_grad_norm=-1", r"'max_grad_norm' must be >= 0, got -1.0$"),
    ("lora.dropout=1", r"'lora.dropout' must be >= 0 and < 1, got 1.0$"),
    ("lora.target_modules=[]", r"'lora.target_modules' is empty; name at least one$"),  # PEFT refused it after the load
])
def test_train_dry_run_refuses_a_setting_transformers_would_refuse_after_the_model_loaded(sft, tmp_path, override, pattern):
    """These passed --dry-run and failed in the child after the model loaded (a 70-95-line traceback)."""
    out = tmp_path / "ck"
    proc = run_pipeline("train", "--config", TINY, f"dataset_dir={sft}", f"output_root={out}", override, "--dry-run")
    refused(proc, r"^error: the command line: " + pattern)
    assert nothing_under(out) == []


def test_report_to_an_integration_whose_package_is_missing_is_refused_at_config_time(sft, tmp_path):
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    missing = [name for name in INTEGRATION_TO_CALLBACK if name not in (*get_available_reporting_integrations(), "flyte")]
    assert missing, "every logging integration is installed here"
    proc = run_pipeline("train", "--config", TINY, f"dataset_dir={sft}", f"output_root={tmp_path}",
                        f"report_to={missing[0]}", "--dry-run")
    refused(proc, rf"'report_to' is '{missing[0]}', whose package is not installed here .*report_to=none$")


@pytest.mark.parametrize("override, pattern", [
    ("loss_type=nope", r"'loss_type' must be one of TRL's GRPO loss types: grpo, dr_grpo, dapo, .*got 'nope'$"),
    ("scale_rewards=maybe", r"'scale_rewards' must be one of TRL's reward scalings: group, batch, none; got 'maybe'$"),
    ("beta=-1", r"'beta' must be >= 0, got -1.0$"),
    ("epsilon=0", r"'epsilon' must be > 0, got 0.0$"),
    ("optim=adam", r"'optim' must be one of transformers' optimizers"),
    ("rollout.vllm_gpu_memory_utilization=1.5", r"'rollout.vllm_gpu_memory_utilization' must be > 0 and <= 1, got 1.5$"),
    ("rollout.vllm_server_base_url=gpu01:8000", r"'rollout.vllm_server_base_url' must be an http\(s\) URL with a host"),
])
def test_grpo_dry_run_refuses_a_setting_trl_would_refuse_after_a_step_of_rollouts(tmp_path, override, pattern):
    """loss_type failed after the model loaded and a whole step of rollouts ran."""
    proc = run_pipeline("grpo", "--config", GRPO_YAML, "student=smollm2", f"output_root={tmp_path}", override, "--dry-run")
    refused(proc, r"^error: the command line: " + pattern)
    assert nothing_under(tmp_path) == []


def test_trls_loss_types_and_reward_scalings_are_the_installed_trls():
    """TRL has no enumeration of them: read back the values its GRPOTrainer branches on and its
    GRPOConfig's help lists, so a TRL upgrade that adds or drops one fails here."""
    from pipeline.train.settings import GRPO_LOSS_TYPES, SCALE_REWARDS

    trainer = (SITE / "trl" / "trainer" / "grpo_trainer.py").read_text(encoding="utf-8")
    config = (SITE / "trl" / "trainer" / "grpo_config.py").read_text(encoding="utf-8")
    branched = set(re.findall(r'loss_type == "(\w+)"', trainer))
    helped = re.search(r"Supported values are (.+?)\. ", config.replace('"\n            "', ""))
    assert helped, "TRL's GRPOConfig.loss_type help changed its wording"
    assert set(re.findall(r"'(\w+)'", helped[1])) == set(GRPO_LOSS_TYPES)
    assert branched <= set(GRPO_LOSS_TYPES)
    scalings = re.search(r"Invalid value for scale_rewards: .*?Must be one of (.+?)\.", trainer, re.S)
    assert scalings and set(re.findall(r"'(\w+)'", scalings[1])) == set(SCALE_REWARDS)


def test_transformers_optimizer_and_scheduler_names_read_from_its_source_are_its_enumerations(tmp_path, monkeypatch):
    """`optim` and `lr_scheduler` are checked against transformers' enumerations read from their
    source files (importing them costs every train/grpo/run process 3-5 s of torch and PEFT):
    the same names as the imported enumerations; a class built another way is refused, not misread."""
    from transformers.trainer_utils import SchedulerType
    from transformers.training_args import OptimizerNames

    from pipeline.train import settings

    assert settings.optimizer_names() == tuple(o.value for o in OptimizerNames)
    assert settings.scheduler_names() == tuple(s.value for s in SchedulerType)
    (tmp_path / "fakelib").mkdir()
    (tmp_path / "fakelib" / "__init__.py").write_text("")
    (tmp_path / "fakelib" / "names.py").write_text('class Names:\n    """doc"""\n    A = "a"\n    B = "b".upper()\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError, match=r"Names is not a list of NAME = \"value\" lines"):
        settings.enum_values("fakelib.names", "Names")
    with pytest.raises(RuntimeError, match="defines no class Other"):
        settings.enum_values("fakelib.names", "Other")


# The keys each config hands to transformers' TrainingArguments / TRL's GRPOConfig / PEFT as they are
HANDED_TO_LIBRARIES = {
    "FinetuneConfig": ("learning_rate", "lr_scheduler", "warmup_ratio", "weight_decay", "max_grad_norm", "optim", "report_to"),
    "GrpoConfig": ("learning_rate", "lr_scheduler", "warmup_ratio", "weight_decay", "max_grad_norm", "optim", "report_to",
                   "beta", "epsilon", "loss_type", "scale_rewards"),
    "RolloutSettings": ("vllm_gpu_memory_utilization", "vllm_server_base_url"),
    "LoraSettings": ("dropout", "target_modules"),
    "LLMConfig": ("device", "gpu_memory_utilization"),
    "MethodSettings": ("temperature", "cot_sc_temperature"),
}


def test_every_setting_handed_to_a_library_declares_its_check_and_every_default_passes_it():
    """The class: no such key without a check `build` runs; and no stage's default is refused by
    its own check (a check that refused the default would refuse every run)."""
    from pipeline.core.config import CHECK

    configs = {cls.__name__: cls for cls in stage_configs()}
    unchecked = [f"{name}.{key}" for name, keys in HANDED_TO_LIBRARIES.items() for key in keys
                 if CHECK not in {f.name: f for f in dataclasses.fields(configs[name])}[key].metadata]
    assert not unchecked, f"keys handed to a library without a check (pipeline.core.config.checked): {unchecked}"
    for cls in configs.values():
        for f in dataclasses.fields(cls):
            if CHECK in f.metadata and f.default is not dataclasses.MISSING:
                assert f.metadata[CHECK](f.default) is None, f"{cls.__name__}.{f.name}'s default fails its own check"
            elif CHECK in f.metadata and f.default_factory is not dataclasses.MISSING:
                assert f.metadata[CHECK](f.default_factory()) is None, f"{cls.__name__}.{f.name}"


# -------------------------------------------------------------------------- item 8: the other classes


@pytest.mark.parametrize("stage, override, pattern", [
    ("train", "student_name=../../escape", r"'student_name' must be one folder name \(no '/', no '\.\.'"),
    ("train", "experiment=a/b", r"'experiment' must be one folder name"),
    ("train", "student_name=", r"'student_name' must not be empty \(it names an output folder\)$"),
    ("grpo", "experiment=..", r"'experiment' must be one folder name"),
    ("grpo", "experiment=", r"'experiment' must not be empty"),
])
def test_a_name_that_would_escape_or_empty_its_output_folder_is_refused(sft, tmp_path, stage, override, pattern):
    """`student_name=../../escape` wrote into <output_root>/default/../../escape/react."""
    out = tmp_path / "root" / "ck"
    args = ["--config", TINY, f"dataset_dir={sft}"] if stage == "train" else ["--config", GRPO_YAML, "student=smollm2"]
    proc = run_pipeline(stage, *args, f"output_root={out}", override, "--dry-run")
    refused(proc, r"^error: the command line: " + pattern)
    assert nothing_under(tmp_path) == []


TWO_STUDENTS = ("students=[{name: a, config: configs/students/smollm2-135m.yaml, size_class: 135m, params_b: 0.135},"
                " {name: a, config: configs/students/smollm2-135m.yaml, size_class: 135m, params_b: 0.135}]")


@pytest.mark.parametrize("override, pattern", [
    ("formats=[]", r"^error: the command line: 'formats' is empty; name at least one$"),
    ("formats=[react, react]", r"^error: the command line: 'formats' names 'react' more than once; name each once$"),
    ("grpo.formats=[react, react]", r"'grpo.formats' names 'react' more than once"),
    ("generate.methods=[react, react]", r"^error: generate: 'methods' names 'react' more than once"),
    ("self_training.formats=[react, react]", r"'self_training.formats' names 'react' more than once"),
    (TWO_STUDENTS, r"^error: students: 'a' names two students; give each its own name"),
    ("experiment=../x", r"'experiment' must be one folder name"),
    ("eval.model.device=tpu", r"'model.device' must be auto, cpu, cuda, cuda:N or mps; got 'tpu'$"),
    ("eval.prompting.temperature=-1", r"'prompting.temperature' must be >= 0, got -1.0$"),
    ("eval.model.gpu_memory_utilization=2", r"'model.gpu_memory_utilization' must be > 0 and <= 1, got 2.0$"),
])
def test_run_print_config_refuses_empty_or_repeated_selections_devices_and_sampling_out_of_range(tmp_path, override, pattern):
    """A repeated format trained twice into one folder; `tpu` was a torch traceback when the model
    loaded; a temperature of -1 ended every episode in an llm_error, found per episode."""
    refused(run_pipeline("run", "--config", "configs/small-rounds.yaml", f"out_dir={tmp_path / 'runs'}", override,
                         "--print-config"), pattern)
    assert nothing_under(tmp_path) == []


def test_eval_refuses_a_device_that_does_not_exist_before_loading_and_a_sampling_setting_out_of_range(tmp_path):
    refused(run_pipeline("eval", "model.device=tpu", f"out_dir={tmp_path}"), r"'model.device' must be auto, cpu")
    refused(run_pipeline("eval", "prompting.temperature=-0.5", "methods=[cot]", f"out_dir={tmp_path}"),
            r"^error: the command line: 'prompting.temperature' must be >= 0, got -0.5$")
    assert nothing_under(tmp_path) == []


def test_a_section_opened_on_the_command_line_is_blamed_on_the_command_line(tmp_path):
    """`llm.device=cuda` (eval's section is `model`) was blamed on "config", the YAML file's name."""
    config = tmp_path / "eval.yaml"
    config.write_text("limit: 2\n", encoding="utf-8")
    refused(run_pipeline("eval", "--config", str(config), "llm.device=cuda"),
            r"^error: the command line: unknown key 'llm'")


def test_build_blames_the_file_for_a_section_the_command_line_did_not_open():
    from pipeline.stages.eval import EvalConfig

    with pytest.raises(PipelineError, match=r"^x.yaml: unknown key 'llm'"):
        build(EvalConfig, {"llm": {"device": "cpu"}, "limit": 3}, where="x.yaml", given=frozenset({"limit"}))


# -------------------------------------------------------------------------- item 7: one list, dry run = launch

SMOLLM2 = "configs/students/smollm2-135m.yaml"


@pytest.mark.parametrize("override, pattern", [
    ("resume=/nonexistent/checkpoint-4", r"^error: resume: /nonexistent/checkpoint-4 not found; give a checkpoint-N folder"),
    ("finetuning=qlora", r"^error: finetuning: qlora needs a CUDA GPU"),
    ("optim=adamw_bnb_8bit", r"^error: optim: adamw_bnb_8bit needs bitsandbytes"),
    ("max_length=64 long_examples=error", r"^error: SFT record 0 \(id 'fireact-0'\) is \d+ tokens, over max_length=64"),
    ("student=/nonexistent/llama", r"^error: student: /nonexistent/llama not found"),
    ("EMPTY", r"^error: .*/react/train\.jsonl: no training examples$"),
])
def test_train_dry_run_refuses_what_the_launch_refuses(sft, tmp_path, override, pattern):
    """Each passed --dry-run (exit 0, the launch command printed) and failed in the child."""

    if "qlora" in override or "bnb" in override:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU machine: QLoRA and 8-bit optimizers can run")
    dataset = sft
    if override == "EMPTY":
        dataset = tmp_path / "empty"
        write_dataset(dataset, "react", [])
    out = tmp_path / "ck"
    extra = [] if override == "EMPTY" else override.split()
    proc = run_pipeline("train", "--config", SMOLLM2, f"dataset_dir={dataset}", f"output_root={out}", *extra, "--dry-run")
    refused(proc, pattern)
    assert nothing_under(out) == []


def test_a_refused_launch_leaves_the_folders_config_file_as_it_was(sft, tmp_path):
    """The child refused QLoRA on CPU after the parent had rewritten <output_dir>/finetune_config.yaml:
    the record of the run that made the folder was replaced by one that never ran."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU machine: QLoRA can run")
    folder = tmp_path / "ck" / "default" / "smollm2-135m-instruct" / "react"
    folder.mkdir(parents=True)
    (folder / "finetune_config.yaml").write_text("# the earlier run's\n", encoding="utf-8")
    proc = run_pipeline("train", "--config", SMOLLM2, f"dataset_dir={sft}", f"output_root={tmp_path / 'ck'}",
                        "finetuning=qlora", "max_steps=1", timeout=300)
    refused(proc, r"^error: finetuning: qlora needs a CUDA GPU")
    assert (folder / "finetune_config.yaml").read_text(encoding="utf-8") == "# the earlier run's\n"
    assert nothing_under(folder) == ["finetune_config.yaml"]


@pytest.mark.parametrize("override, pattern", [
    ("heldout.every=5 heldout.questions=offline-evl", r"^error: heldout\.questions: unknown question set 'offline-evl' of HotpotQA"),
    ("resume=/nonexistent/checkpoint-2", r"^error: resume: /nonexistent/checkpoint-2 not found"),
    ("optim=adamw_bnb_8bit", r"^error: optim: adamw_bnb_8bit needs bitsandbytes"),
])
def test_grpo_dry_run_refuses_what_the_launch_refuses(tmp_path, override, pattern):
    """The held-out set was loaded by the child after the model and its first rollouts."""
    if "bnb" in override:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU machine: 8-bit optimizers can run")
    proc = run_pipeline("grpo", "--config", GRPO_YAML, "student=smollm2", f"output_root={tmp_path}", *override.split(),
                        "--dry-run")
    refused(proc, pattern)
    assert nothing_under(tmp_path) == []


@pytest.mark.parametrize("override, pattern", [
    ("train.resume=/nonexistent/checkpoint-4", r"^error: train: smollm2-135m on standard: resume: /nonexistent/checkpoint-4 not found"),
    ("train.finetuning=qlora", r"^error: train: smollm2-135m on standard: finetuning: qlora needs a CUDA GPU"),
    ("grpo.settings.heldout.every=5 grpo.settings.heldout.questions=offline-evl",
     r"^error: grpo: smollm2-135m from its react fine-tune: heldout\.questions: unknown question set 'offline-evl'"),
])
def test_run_print_config_refuses_what_each_launch_refuses_from_the_same_list(tmp_path, override, pattern):
    if "qlora" in override:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU machine: QLoRA can run")
    refused(run_pipeline("run", "--config", "configs/small-rounds.yaml", f"out_dir={tmp_path / 'runs'}",
                         *override.split(), "--print-config"), pattern)
    assert nothing_under(tmp_path) == []


def test_train_dry_run_refuses_a_deepspeed_json_that_cannot_be_read(sft, tmp_path):
    """Every rank read the DeepSpeed JSON the accelerate config names only after the launch."""
    accelerate = tmp_path / "zero.yaml"
    accelerate.write_text("distributed_type: DEEPSPEED\nnum_processes: 1\nuse_cpu: true\n"
                          f"deepspeed_config:\n  deepspeed_config_file: {tmp_path / 'zero9.json'}\n", encoding="utf-8")
    out = tmp_path / "ck"
    proc = run_pipeline("train", "--config", TINY, f"dataset_dir={sft}", f"output_root={out}", "deepspeed_on_cpu=true",
                        f"accelerate_config={accelerate}", "--dry-run")
    refused(proc, r"^error: deepspeed_config_file: cannot read .*zero9\.json .*fix the path in the accelerate config")
    assert nothing_under(out) == []
