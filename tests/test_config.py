"""Layered configs: defaults < YAML < key=value, with clear errors for bad keys and types."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.core.config import load_config, to_dict
from pipeline.core.errors import PipelineError


@dataclass
class Sampling:
    temperature: float = 0.0
    n: int = 1


@dataclass
class StageConfig:
    methods: list[str] = field(default_factory=lambda: ["react"])
    limit: int | None = None
    out_dir: Path = Path("runs/x")
    verbose: bool = False
    sampling: Sampling = field(default_factory=Sampling)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_defaults_then_yaml_then_overrides(tmp_path):
    path = write(tmp_path, "limit: 5\nsampling:\n  n: 21\n")
    cfg = load_config(StageConfig, path, ["sampling.temperature=0.7", "methods=[act, cot]"])
    assert cfg.limit == 5 and cfg.sampling.n == 21 and cfg.sampling.temperature == 0.7
    assert cfg.methods == ["act", "cot"] and cfg.out_dir == Path("runs/x")


def test_section_of_an_experiment_file(tmp_path):
    path = write(tmp_path, "generate:\n  limit: 3\nfilter:\n  cap: 10\n")
    assert load_config(StageConfig, path, section="generate").limit == 3


def test_float_in_exponent_form_without_a_dot():
    assert load_config(Sampling, None, ["temperature=1e-4"]).temperature == 1e-4
    with pytest.raises(PipelineError, match="'temperature'"):
        load_config(Sampling, None, ["temperature=hot"])


def test_single_value_for_a_list_key():
    assert load_config(StageConfig, None, ["methods=react"]).methods == ["react"]


def test_unknown_key_suggests_the_close_one(tmp_path):
    with pytest.raises(PipelineError, match=r"unknown key 'limt'; did you mean 'limit'"):
        load_config(StageConfig, write(tmp_path, "limt: 5\n"))
    with pytest.raises(PipelineError, match=r"unknown key 'sampling.temprature'; did you mean 'sampling.temperature'"):
        load_config(StageConfig, None, ["sampling.temprature=1"])


@pytest.mark.parametrize("override,key", [("limit=many", "limit"), ("verbose=3", "verbose"),
                                          ("sampling.n=1.5", "sampling.n"), ("sampling=4", "sampling")])
def test_wrong_types_name_the_key(override, key):
    with pytest.raises(PipelineError, match=f"'{key}'"):
        load_config(StageConfig, None, [override])


def test_bad_files(tmp_path):
    with pytest.raises(PipelineError, match="config file not found"):
        load_config(StageConfig, tmp_path / "missing.yaml")
    with pytest.raises(PipelineError, match="not valid YAML"):
        load_config(StageConfig, write(tmp_path, "a: [1,\n"))
    with pytest.raises(PipelineError, match="mapping"):
        load_config(StageConfig, write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(PipelineError, match="not key=value"):
        load_config(StageConfig, None, ["limit"])


def test_yaml_is_loaded_safely(tmp_path):
    path = write(tmp_path, "limit: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(PipelineError, match="not valid YAML"):
        load_config(StageConfig, path)


def test_to_dict_is_json_friendly():
    assert to_dict(StageConfig())["out_dir"] == "runs/x"


def test_cli_lists_every_stage_and_rejects_unknown():
    out = subprocess.run([sys.executable, "-m", "pipeline", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for stage in ("data", "wiki", "generate", "filter", "train", "eval", "plot", "run"):
        assert stage in out.stdout
    bad = subprocess.run([sys.executable, "-m", "pipeline", "bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_renamed_and_removed_keys_name_the_new_key(tmp_path):
    """Configs written before the renames fail with the new key's name, not a guess."""
    from pipeline.stages.eval import EvalConfig
    from pipeline.stages.generate import GenerateConfig
    from pipeline.train.config import FinetuneConfig

    with pytest.raises(PipelineError, match=r"unknown key 'method'; it was renamed: use 'prompting'"):
        load_config(GenerateConfig, write(tmp_path, "generate:\n  method:\n    max_steps: 5\n"), section="generate")
    with pytest.raises(PipelineError, match=r"unknown key 'method'; it was renamed: use 'prompting'"):
        load_config(EvalConfig, None, ["method.max_new_tokens=8"])
    with pytest.raises(PipelineError, match=r"unknown key 'method'; it was renamed: use 'format'"):
        load_config(FinetuneConfig, None, ["method=act"])
    # eval's model to evaluate was `checkpoint` (a word kept for training's checkpoint-N folders)
    with pytest.raises(PipelineError, match=r"unknown key 'checkpoint'; it was renamed: use 'finetuned'"):
        load_config(EvalConfig, None, ["checkpoint=checkpoints/x/react/final"])
    with pytest.raises(PipelineError, match=r"unknown key 'checkpoint'; it was renamed: use 'finetuned'"):
        load_config(EvalConfig, write(tmp_path, "eval:\n  checkpoint: forestai/fireact_llama_2_7b_lora\n"),
                    section="eval")
    with pytest.raises(PipelineError, match=r"unknown key 'wiki.max_steps'; it was removed \(never read; the step limit is prompting.max_steps\)"):
        load_config(GenerateConfig, None, ["wiki.max_steps=7"])


def test_an_old_run_folder_still_resumes(tmp_path):
    """A manifest written with the old key names (`method:` block, wiki.max_steps) is read in
    today's names, so the same run resumes instead of being refused."""
    from pipeline.agent.run_folder import check_resumable
    from pipeline.core.storage import write_manifest
    from pipeline.stages.generate import IDENTITY_KEYS, GenerateConfig

    cfg = load_config(GenerateConfig, None, ["prompting.max_steps=5"])
    old = to_dict(cfg)
    old["method"] = old.pop("prompting")
    old["wiki"]["max_steps"] = 7
    write_manifest(tmp_path / "manifest.json", stage="generate", config=old, complete=False)
    check_resumable(tmp_path, "generate", cfg, IDENTITY_KEYS)
    other = load_config(GenerateConfig, None, ["prompting.max_steps=6"])
    with pytest.raises(PipelineError, match="different prompting"):
        check_resumable(tmp_path, "generate", other, IDENTITY_KEYS)


def test_stage_help_lists_every_key_with_type_default_and_comment(capsys):
    from pipeline.cli import main

    with pytest.raises(SystemExit):
        main(["filter", "--help"])
    out = capsys.readouterr().out
    assert "max_per_method" in out and "int = 3000" in out
    assert "tokenizer" in out and '"smollm2", a local folder or a hub id' in out
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = capsys.readouterr().out
    for line in ("prompting.max_steps", "int = 7  # Act / ReAct step limit", "finetuned", "model.backend", "wiki.index"):
        assert line in out, line


def test_print_config_shows_the_effective_config_without_running(tmp_path, capsys):
    import yaml

    from pipeline.cli import main

    path = write(tmp_path, "generate:\n  limit: 5\n  prompting:\n    max_steps: 4\n")
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--config", str(path), "limit=3", f"out_dir={tmp_path / 'gen'}", "--print-config"])
    assert exit_.value.code == 0 and not (tmp_path / "gen").exists()
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["limit"] == 3 and printed["prompting"]["max_steps"] == 4 and printed["questions"] == "offline-bootstrap"
    with pytest.raises(SystemExit):  # train prints the resolved config: steps and folders filled in
        main(["train", "format=act", "size_class=8b", "--print-config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["max_steps"] == 4000 and printed["output_dir"].endswith("act")


def run_writing_configs() -> list[type]:
    """The configs whose fields decide whether a run folder is the same run (resume, skip)."""
    from pipeline.llm.config import LLMConfig
    from pipeline.stages.eval import EvalConfig
    from pipeline.stages.filter import FilterConfig
    from pipeline.stages.generate import GenerateConfig

    return [GenerateConfig, EvalConfig, FilterConfig, LLMConfig]


def test_every_field_of_a_run_writing_config_says_what_its_change_does_to_the_run():
    """A new field must be declared identity / target / input / free (pipeline.core.same_run):
    one left undeclared would silently count as neither."""
    from pipeline.core.same_run import unclassified

    missing = {cls.__name__: unclassified(cls) for cls in run_writing_configs() if unclassified(cls)}
    assert not missing, f"declare these fields with same_run(...): {missing}"


def test_the_declared_keys_are_the_ones_the_stages_used_to_list_by_hand():
    """The same runs as before the declarations: the lists derived from the fields are the former
    hand-kept IDENTITY_KEYS (generate, eval), CONTENT_KEYS, SHARD_SET_KEYS and OPERATIONAL_KEYS."""
    from pipeline.agent.run_folder import OPERATIONAL_KEYS
    from pipeline.core.same_run import run_keys, shard_set_keys
    from pipeline.stages import eval as eval_stage
    from pipeline.stages import filter as filter_stage
    from pipeline.stages import generate

    assert generate.IDENTITY_KEYS == ("task", "teacher", "oracle", "questions", "prompting", "wiki", "shard", "samples")
    assert run_keys(generate.GenerateConfig, "target") == ("order_seed",)
    assert eval_stage.IDENTITY_KEYS == ("task", "model", "oracle", "finetuned", "format", "base_model", "questions",
                                        "prompting", "wiki", "shard")
    assert set(filter_stage.CONTENT_KEYS) == {"min_f1", "require_finished", "max_per_method", "per_question", "seed",
                                              "tokenizer", "fireact_other_tasks", "shuffle", "equal_rows"}
    assert set(filter_stage.SHARD_SET_KEYS) == set(shard_set_keys(generate.GenerateConfig)) == {
        "task", "teacher", "oracle", "questions", "prompting", "wiki", "samples", "limit"}
    assert set(OPERATIONAL_KEYS) == {"max_batch_size", "max_concurrency", "timeout_s", "max_retries", "device",
                                     "ready_timeout_s",
                                     "base_url"}


def test_an_unclassified_field_is_found():
    from pipeline.core.same_run import same_run, unclassified

    @dataclass
    class Grown:
        task: str = same_run("identity", default="hotpotqa")
        new_knob: int = 3

    assert unclassified(Grown) == ["new_knob"]
    with pytest.raises(ValueError, match="not one of identity, target, input, free"):
        same_run("sometimes", default=1)


def test_the_llm_api_key_was_mode_and_old_files_still_read(tmp_path):
    """`mode` meant three things; an LLM section's (completions | chat) is now `api`. The old key
    fails naming the new one; a manifest written with it resumes (generate) and is skipped as
    done (`run`)."""
    from pipeline.agent.run_folder import check_resumable
    from pipeline.core.storage import write_manifest
    from pipeline.stages.generate import IDENTITY_KEYS, GenerateConfig
    from pipeline.stages.grid.children import unit_done

    with pytest.raises(PipelineError, match=r"unknown key 'teacher.mode'; it was renamed: use 'teacher.api'"):
        load_config(GenerateConfig, None, ["teacher.mode=chat"])
    cfg = load_config(GenerateConfig, None, ["teacher.api=chat", f"out_dir={tmp_path}"])
    old = to_dict(cfg)
    old["teacher"]["mode"] = old["teacher"].pop("api")
    write_manifest(tmp_path / "manifest.json", stage="generate", config=old, complete=True)
    check_resumable(tmp_path, "generate", cfg, IDENTITY_KEYS)
    assert unit_done(cfg)
    with pytest.raises(PipelineError, match="different teacher"):
        check_resumable(tmp_path, "generate", load_config(GenerateConfig, None, ["teacher.api=completions"]),
                        IDENTITY_KEYS)
    assert not unit_done(load_config(GenerateConfig, None, ["teacher.api=completions", f"out_dir={tmp_path}"]))


def test_the_prompting_style_key_was_mode_and_old_files_still_read(tmp_path):
    """How a method builds its prompts (prompt | zero_shot | fireact) is `prompting.style`; "mode"
    is left to what a summary row says of its model (prompt | finetune)."""
    from pipeline.agent.run_folder import check_resumable
    from pipeline.core.storage import write_manifest
    from pipeline.stages.eval import IDENTITY_KEYS, EvalConfig

    with pytest.raises(PipelineError, match=r"unknown key 'prompting.mode'; it was renamed: use 'prompting.style'"):
        load_config(EvalConfig, None, ["prompting.mode=zero_shot"])
    cfg = load_config(EvalConfig, None, ["prompting.style=zero_shot"])
    old = to_dict(cfg)
    old["prompting"]["mode"] = old["prompting"].pop("style")
    write_manifest(tmp_path / "manifest.json", stage="eval", config=old, complete=False)
    check_resumable(tmp_path, "eval", cfg, IDENTITY_KEYS)
    with pytest.raises(PipelineError, match="different prompting"):
        check_resumable(tmp_path, "eval", load_config(EvalConfig, None, ["prompting.style=prompt"]), IDENTITY_KEYS)


def test_a_model_teachers_manifest_written_with_oracle_style_still_resumes_and_skips(tmp_path):
    """Before generate's `oracle` key every LLM section carried `oracle_style: exact` (meaningless
    to a model) and no `oracle`: such a manifest is the same run as today's config (oracle: null),
    and not the stand-in teacher's. `teacher.oracle_style` and `teacher.backend=oracle` now fail
    naming the `oracle` key."""
    from pipeline.agent.run_folder import check_resumable
    from pipeline.core.storage import write_manifest
    from pipeline.stages.generate import IDENTITY_KEYS, GenerateConfig
    from pipeline.stages.grid.children import unit_done

    with pytest.raises(PipelineError, match=r"unknown key 'teacher.oracle_style'; it was removed .*use oracle=agent"):
        load_config(GenerateConfig, None, ["teacher.oracle_style=agent"])
    with pytest.raises(PipelineError, match=r"not a language-model backend: set `oracle: exact` \(or agent\)"):
        load_config(GenerateConfig, None, ["teacher.backend=oracle"])
    cfg = load_config(GenerateConfig, None, ["teacher.model=smollm2", f"out_dir={tmp_path}"])
    old = to_dict(cfg)
    del old["oracle"]
    old["teacher"]["oracle_style"] = "exact"
    write_manifest(tmp_path / "manifest.json", stage="generate", config=old, complete=True)
    check_resumable(tmp_path, "generate", cfg, IDENTITY_KEYS)
    assert unit_done(cfg)
    oracle = load_config(GenerateConfig, None, ["oracle=exact", f"out_dir={tmp_path}"])
    with pytest.raises(PipelineError, match="different teacher, oracle"):
        check_resumable(tmp_path, "generate", oracle, IDENTITY_KEYS)
    assert not unit_done(oracle)
