"""The newest parts as a new user meets them (issue 39): a bad input is one line and exit 2 in
every stage, a refusal writes nothing, a plan is checked when it is made, and the messages and
`--help` say what is true. Each case runs the real CLI (`python -m pipeline ...`) where the
issue saw it; the class checks (every int key's bound, every trajectory reader) run in process.

    .venv/bin/python -m pytest tests/test_first_use.py -n 0 -q
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import shutil
import typing
from pathlib import Path

import pytest
from episode_testdata import CORPUS, run_pipeline
from sft_testdata import fireact_records, write_dataset

from pipeline.core.config import build, nested_dataclass
from pipeline.core.errors import PipelineError

REPO = Path(__file__).resolve().parents[1]
TINY = "configs/students/tiny.yaml"
GRPO_YAML = "configs/grpo/smollm2-135m.yaml"


def last_line(proc) -> str:
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[-1] if lines else ""


def refused(proc, pattern: str) -> None:
    """Exit 2 with one `error:` line matching `pattern` (the last line), and no traceback."""
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert re.search(pattern, last_line(proc)), last_line(proc)
    assert last_line(proc).startswith("error: ")


# -------------------------------------------------------------------------- integer bounds


@pytest.mark.parametrize("args, key, value", [
    (["train", "--config", TINY, "max_per_device_batch_size=0", "--dry-run"], "max_per_device_batch_size", 0),
    (["grpo", "--config", GRPO_YAML, "per_device_batch_size=null", "max_per_device_batch_size=0", "--dry-run"],
     "max_per_device_batch_size", 0),
    (["run", "--config", "configs/demo.yaml", "train.max_per_device_batch_size=-1", "--print-config"],
     "max_per_device_batch_size", -1),
    (["grpo", "--config", GRPO_YAML, "limit=0", "--dry-run"], "limit", 0),  # was "0 distinct questions"
    (["eval", "oracle=exact", "limit=0"], "limit", 0),  # was "question set ... is empty"
])
def test_an_integer_below_its_bound_is_one_line_naming_the_key(args, key, value):
    """A per-device batch bound of 0 ended in `ValueError: max() arg is an empty sequence`."""
    proc = run_pipeline(*args)
    refused(proc, rf"'{re.escape(key)}' must be >= 1, got {value}$")
    assert "the command line" in last_line(proc) or args[0] == "run"


def stage_configs() -> list[type]:
    """Every config a stage builds from YAML and the command line, nested sections included."""
    from pipeline.rounds import SelfTrainingConfig
    from pipeline.stages.eval import EvalConfig
    from pipeline.stages.filter import FilterConfig
    from pipeline.stages.generate import GenerateConfig
    from pipeline.stages.grid.spec import GrpoPhase, RunConfig, Student
    from pipeline.stages.grpo import GrpoConfig
    from pipeline.stages.plot import PlotConfig
    from pipeline.stages.publish import PublishConfig
    from pipeline.train.config import FinetuneConfig

    found: list[type] = []

    def walk(cls: type) -> None:
        if cls in found:
            return
        found.append(cls)
        for hint in typing.get_type_hints(cls).values():
            nested = nested_dataclass(hint)
            if nested is not None:
                walk(nested)

    for cls in (GenerateConfig, FilterConfig, FinetuneConfig, GrpoConfig, EvalConfig, PlotConfig, PublishConfig,
                RunConfig, Student, GrpoPhase, SelfTrainingConfig):
        walk(cls)
    return found


def int_fields(cls: type) -> list[dataclasses.Field]:
    hints = typing.get_type_hints(cls)
    return [f for f in dataclasses.fields(cls) if f.init and int in (hints[f.name], *typing.get_args(hints[f.name]))]


def test_every_integer_key_of_every_stage_declares_its_bound_and_build_refuses_below_it():
    """The class of the max() traceback: no int key without a declared least value, and the
    value under it is refused by the config builder itself, naming the key, for every one."""
    from pipeline.core.config import AT_LEAST

    undeclared, checked = [], 0
    for cls in stage_configs():
        for f in int_fields(cls):
            bound = f.metadata.get(AT_LEAST)
            if bound is None:
                undeclared.append(f"{cls.__name__}.{f.name}")
                continue
            with pytest.raises(PipelineError, match=rf"'{f.name}' must be >= {bound}, got {bound - 1}( \(.+\))?$"):
                build(cls, {f.name: bound - 1})
            checked += 1
    assert not undeclared, f"int keys without at_least/bound (pipeline.core.config): {undeclared}"
    assert checked >= 40  # every stage's: batch sizes, steps, limits, seeds, ports ...


def test_an_int_option_below_its_bound_is_refused_not_read_as_not_given():
    """`--num-processes 0` was falsy, so the accelerate config's count was used without a word."""
    proc = run_pipeline("train", "--config", TINY, "--num-processes", "0", "--dry-run")
    refused(proc, r"^error: --num-processes must be >= 1, got 0$")
    assert proc.stderr.count("\n") == 1  # one line: no usage block


def stage_parsers() -> list:
    """Every stage's parser and sub-command parser, as the CLI builds them."""
    import argparse
    import importlib

    from pipeline.cli import STAGES

    parsers = []
    for module_name, _ in STAGES.values():
        parser = argparse.ArgumentParser()
        importlib.import_module(module_name).add_arguments(parser)
        parsers.append(parser)
    for parser in list(parsers):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers += list(action.choices.values())
    return parsers


def test_every_int_option_of_every_stage_declares_its_bound():
    """The class for options: no plain `type=int` (which takes 0 and -1) in any stage's parser."""
    plain = [f"{p.prog} {a.option_strings}" for p in stage_parsers() for a in p._actions if a.type is int]
    bounded = [a for p in stage_parsers() for a in p._actions if getattr(a.type, "__name__", "").startswith("int >=")]
    assert not plain and len(bounded) >= 10, plain


# -------------------------------------------------------------------------- a refusal writes nothing


def folder_bytes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_generate(tmp_path_factory, index) -> tuple[Path, list[str]]:
    """A complete generate folder (the stand-in teacher, 3 questions, ReAct) and its arguments."""
    folder = tmp_path_factory.mktemp("gen") / "generate"
    args = ["generate", "oracle=exact", "questions=offline-eval", "limit=3", f"wiki.index={index}",
            f"out_dir={folder}", "methods=[react]", "max_in_flight=2"]
    proc = run_pipeline(*args)
    assert proc.returncode == 0, proc.stderr
    return folder, args


pytestmark_corpus = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")


@pytestmark_corpus
def test_a_refusal_into_a_finished_generate_folder_leaves_its_files_byte_for_byte(finished_generate, tmp_path):
    """`target_correct=0` into a finished folder rewrote its manifest (stats gone, complete:
    false) before refusing, so `filter` then refused the folder."""
    from pipeline.agent.run_folder import writing_run
    from pipeline.core.config import load_config, to_dict
    from pipeline.stages.generate import GenerateConfig, identity_keys

    source, args = finished_generate
    folder = tmp_path / "generate"
    shutil.copytree(source, folder)
    args = [a if not a.startswith("out_dir=") else f"out_dir={folder}" for a in args]
    before = folder_bytes(folder)
    refused(run_pipeline(*args, "target_correct=0"), r"target_correct'? must be >= 1, got 0$")
    assert folder_bytes(folder) == before
    # the class: any refusal raised inside the held run folder, before a record is written,
    # puts the finished manifest back (the stage's own later refusals included)
    cfg = load_config(GenerateConfig, None, args[1:])
    with pytest.raises(PipelineError, match="refused late"):
        with writing_run(cfg, identity_keys(cfg), dict(stage="generate", config=to_dict(cfg))):
            raise PipelineError("refused late")
    assert folder_bytes(folder) == before
    proc = run_pipeline("filter", f"inputs=[{folder}]", f"out_dir={tmp_path / 'sft'}", "formats=[react]")
    assert proc.returncode == 0, proc.stderr  # the folder is still complete


# -------------------------------------------------------------------------- every bound, every name: refused, nothing written

# Each stage's config, how its CLI is given one key (`run` needs its grid file; a student's keys
# ride in a one-student list), from which the cases below are generated field by field.
DEMO = str(REPO / "configs" / "demo.yaml")


def stage_entries() -> list[tuple[str, type, list[str], str]]:
    """(stage, its top config class, the arguments before the key, how a key is written: a
    format with {key} and {value})."""
    from pipeline.stages.eval import EvalConfig
    from pipeline.stages.filter import FilterConfig
    from pipeline.stages.generate import GenerateConfig
    from pipeline.stages.grid.spec import RunConfig, Student
    from pipeline.stages.grpo import GrpoConfig
    from pipeline.stages.plot import PlotConfig
    from pipeline.stages.publish import PublishConfig
    from pipeline.train.config import FinetuneConfig

    run = ["--config", DEMO, "--only", "plot"]
    return [("generate", GenerateConfig, [], "{key}={value}"), ("filter", FilterConfig, [], "{key}={value}"),
            ("train", FinetuneConfig, [], "{key}={value}"), ("grpo", GrpoConfig, [], "{key}={value}"),
            ("eval", EvalConfig, [], "{key}={value}"), ("plot", PlotConfig, [], "{key}={value}"),
            ("publish", PublishConfig, [], "{key}={value}"), ("run", RunConfig, run, "{key}={value}"),
            ("run", Student, run, "students=[{{name: s, {key}: {value}}}]")]


def stage_fields() -> list[tuple[str, type, list[str], str, str, dataclasses.Field]]:
    """Every field a stage's CLI reaches, nested sections by their dotted key."""
    out = []

    def walk(stage, cls, args, form, prefix):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            nested = nested_dataclass(hints[f.name])
            if nested is not None:
                walk(stage, nested, args, form, f"{prefix}{f.name}.")
            else:
                out.append((stage, cls, args, form, f"{prefix}{f.name}", f))

    for stage, cls, args, form in stage_entries():
        walk(stage, cls, args, form, "")
    return out


def outside_value(f: dataclasses.Field) -> str | None:
    """A value just outside the field's declared bound or range, as YAML; None: no numeric bound."""
    from pipeline.core.config import AT_LEAST, CHECK

    if f.metadata.get(AT_LEAST) is not None and f.type not in ("float", "float | None"):
        return str(f.metadata[AT_LEAST] - 1)
    bounds = getattr(f.metadata.get(CHECK), "bounds", None)
    if bounds is None:
        return None
    low, high, above, below = bounds
    if low is not None:
        return repr(float(low) if above else float(low) - 0.5)
    return repr(float(high) if below else float(high) + 0.5)


def refused_in_process(argv: list[str], cwd: Path, capsys, monkeypatch) -> str:
    """`python -m pipeline <argv>` in this process, run in the empty folder `cwd`: it must exit 2
    with one `error:` line and leave `cwd` as empty as it was; returns that line."""
    from pipeline.cli import main

    monkeypatch.chdir(cwd)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (argv, err[-2000:])
    assert err.count("\n") == 1 and err.startswith("error: "), (argv, err)
    left = sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*"))
    assert not left, (argv, f"a refusal wrote {left}")
    return err.strip()


def test_every_numeric_key_of_every_stage_declares_its_bound_or_range():
    """The class of `filter min_f1=2` (refused only after a dataset folder was written): no
    float key without a range that the config builder checks."""
    from pipeline.core.config import AT_LEAST, CHECK

    loose = []
    for cls in stage_configs():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kinds = (hints[f.name], *typing.get_args(hints[f.name]))
            if f.init and float in kinds and not getattr(f.metadata.get(CHECK), "bounds", None):
                loose.append(f"{cls.__name__}.{f.name}")
            if f.init and int in kinds and float not in kinds and f.metadata.get(AT_LEAST) is None:
                loose.append(f"{cls.__name__}.{f.name}")
    assert not loose, f"numeric keys without at_least or checked(in_range(...)) (pipeline.core.config): {loose}"


def test_a_value_outside_any_stages_bound_is_refused_naming_the_key_and_writes_nothing(tmp_path, capsys, monkeypatch):
    """Generated from the config dataclasses: every stage's every bounded key (nested sections by
    their dotted key, a grid's student by its list), just outside its bound, through the CLI."""
    tried = 0
    for stage, _, args, form, key, f in stage_fields():
        value = outside_value(f)
        if value is None:
            continue
        cwd = tmp_path / f"{stage}-{tried}"
        cwd.mkdir()
        line = refused_in_process([stage, *args, form.format(key=key, value=value)], cwd, capsys, monkeypatch)
        assert f"'{key.rsplit('.', 1)[-1]}" in line or f"'{key}" in line, (stage, key, line)
        tried += 1
    assert tried >= 70, tried


BAD_NAMES = ["", " ", "../escape", "a/b", "..", ".", ".hidden", "a\\b", "two\nlines", "tab\tname", "x/../y"]


def test_every_name_that_becomes_a_path_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """Generated from the config dataclasses: each field checked by `folder_name` (the one check of
    a name that becomes a file or folder) in every stage, given each kind of bad name: `publish
    name=../escape` wrote beside its folder, `plot name=` wrote `.png`."""
    from pipeline.core.config import CHECK, folder_name

    names = [(stage, args, form, key) for stage, _, args, form, key, f in stage_fields()
             if f.metadata.get(CHECK) is folder_name]
    keys = {key for _, _, _, key in names}
    assert {"name", "experiment", "student_name"} <= keys and len(names) >= 7, names
    for i, (stage, args, form, key) in enumerate(names):
        for j, bad in enumerate(BAD_NAMES):
            cwd = tmp_path / f"{stage}-{i}-{j}"
            cwd.mkdir()
            line = refused_in_process([stage, *args, form.format(key=key, value=json_text(bad))], cwd, capsys, monkeypatch)
            assert re.search(r"must (not be empty|be one line|be one folder name)", line), (stage, key, bad, line)


def json_text(value: str) -> str:
    """A string as YAML reads it back unchanged (a JSON string is YAML)."""
    import json

    return json.dumps(value)


# -------------------------------------------------------------------------- trajectory files


@pytestmark_corpus
def test_filter_refuses_a_trajectory_file_that_is_not_utf8_in_one_line(finished_generate, tmp_path):
    folder = tmp_path / "generate"
    shutil.copytree(finished_generate[0], folder)
    with open(folder / "react.jsonl", "ab") as fh:
        fh.write(b'{"id": "x", "question": "caf\xe9"}\n')  # Latin-1, as an editor might save it
    proc = run_pipeline("filter", f"inputs=[{folder}]", f"out_dir={tmp_path / 'sft'}", "formats=[react]")
    refused(proc, r"react\.jsonl:4: not UTF-8 text \(byte 0xe9\)")


@pytestmark_corpus
def test_a_torn_last_line_is_skipped_and_said_once_with_its_count(finished_generate, tmp_path):
    folder = tmp_path / "generate"
    shutil.copytree(finished_generate[0], folder)
    with open(folder / "react.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"id": "torn", "quest')  # a writer killed mid-line
    proc = run_pipeline("filter", f"inputs=[{folder}]", f"out_dir={tmp_path / 'sft'}", "formats=[react]")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("skipped 1 torn last line") == 1, proc.stderr


@pytest.mark.parametrize("reader", ["observed_pages", "read_trajectories", "released_trajectories", "_read_pairs"])
def test_every_reader_of_a_trajectory_file_refuses_non_utf8_naming_file_and_line(reader, tmp_path):
    """The class: each reader of a JSONL trajectory file, not only filter's."""
    from pipeline.hub.importers import _read_pairs
    from pipeline.tasks.fever.replay import released_trajectories
    from pipeline.wiki.observed import observed_pages
    from pipeline.wiki.replay import read_trajectories

    path = tmp_path / "trajectories.jsonl"
    path.write_bytes(b'{"traj": "Question: a", "question_idx": 0}\n{"traj": "\xff"}\n')
    read = {"observed_pages": lambda p: list(observed_pages(p)), "read_trajectories": lambda p: list(read_trajectories(p)),
            "released_trajectories": released_trajectories.__wrapped__, "_read_pairs": _read_pairs}[reader]
    with pytest.raises(PipelineError, match=rf"{re.escape(str(path))}:2: not UTF-8 text \(byte 0xff\)"):
        read(path)


# -------------------------------------------------------------------------- messages that mislead


def test_flags_and_overrides_in_any_order(tmp_path):
    """`--dry-run` between two overrides was 'unrecognized arguments: max_per_device_batch_size=4'."""
    write_dataset(tmp_path, "react", fireact_records(limit=2))  # a dry run refuses an empty dataset, as the launch does
    proc = run_pipeline("train", "--config", TINY, "max_steps=2", "--dry-run", "max_per_device_batch_size=4",
                        f"dataset_dir={tmp_path}", f"output_root={tmp_path / 'ck'}")
    assert proc.returncode == 0, proc.stderr
    assert "2 steps" in proc.stdout


def test_did_you_mean_knows_other_libraries_names_of_our_keys_before_string_distance():
    """GRPO's `num_generations=4` suggested `num_iterations` (another TRL setting): each class's
    SYNONYMS (TRL's, vLLM's, transformers' names) name a real key of ours, are not keys themselves,
    and their hint is the one the builder gives, for every synonym of every stage's config."""
    tried = 0
    for cls in stage_configs():
        for theirs, (ours, whose) in getattr(cls, "SYNONYMS", {}).items():
            target = cls
            for part in ours.split("."):  # a dotted key walks the nested sections
                hints = typing.get_type_hints(target)
                assert part in hints, f"{cls.__name__}.SYNONYMS[{theirs!r}] names no key {ours!r}"
                target = nested_dataclass(hints[part]) or target
            assert theirs not in typing.get_type_hints(cls), f"{cls.__name__}: {theirs!r} is a key, not a synonym"
            with pytest.raises(PipelineError, match=rf"unknown key '{theirs}'; did you mean '{re.escape(ours)}'\? "
                                                    rf"\({re.escape(whose)} '{theirs}'"):
                build(cls, {theirs: 1})
            tried += 1
    assert tried >= 30, tried
    refused(run_pipeline("grpo", "--config", GRPO_YAML, "num_generations=4", "--dry-run"),
            r"unknown key 'num_generations'; did you mean 'group_size'\? \(TRL's 'num_generations' is")


def test_an_unknown_key_on_the_command_line_is_blamed_on_the_command_line():
    refused(run_pipeline("train", "--config", TINY, "max_stpes=2"),
            r"^error: the command line: unknown key 'max_stpes'; did you mean 'max_steps'\?$")


def test_grpo_reads_an_experiment_yamls_own_grpo_section_and_names_a_missing_one():
    proc = run_pipeline("grpo", "--config", "configs/small-rounds.yaml", "--print-config")
    assert proc.returncode == 0, proc.stderr  # was: unknown key 'formats'
    assert "experiment: small-rounds" in proc.stdout and "group_size: 8" in proc.stdout
    refused(run_pipeline("grpo", "--config", "configs/demo.yaml", "--print-config"),
            r"configs/demo\.yaml is an experiment \(a section per stage\) with no `grpo:` section")


def test_grpos_batch_message_names_its_own_keys():
    proc = run_pipeline("grpo", "--config", GRPO_YAML, "per_device_batch_size=3", "--dry-run")
    refused(proc, r"questions_per_step x group_size=8 = per_device_batch_size x gradient accumulation")
    assert "global_batch_size" not in last_line(proc)


def test_a_folder_given_as_the_wiki_index_is_called_a_folder(tmp_path):
    proc = run_pipeline("eval", "oracle=exact", "size_class=oracle", "params_b=1", "limit=1",
                        f"wiki.index={tmp_path}", f"out_dir={tmp_path / 'eval'}")
    refused(proc, rf"{re.escape(str(tmp_path))} is a folder, not a wiki index; give the index file")


# -------------------------------------------------------------------------- what a newcomer reads


def stage_help(stage: str, capsys) -> str:
    from pipeline.cli import main

    with pytest.raises(SystemExit):
        main([stage, "--help"])
    return capsys.readouterr().out


@pytest.mark.parametrize("stage", ["generate", "filter", "train", "grpo", "eval", "plot", "run", "publish"])
def test_every_stages_help_lists_its_keys_and_an_example_of_one_of_them(stage, capsys):
    text = stage_help(stage, capsys)
    keys = set(re.findall(r"^  ([a-z_][\w.\[\]]*)\s+\S.* = ", text, flags=re.M))
    example = re.search(r"e\.g\.\s+([\w.]+)=", text)
    assert keys and example and example.group(1) in keys, text[-3000:]
    assert "llm.temperature" not in text


def test_run_help_names_every_phase():
    proc = run_pipeline("run", "--help")
    assert proc.returncode == 0
    description = proc.stdout.split("\n\n")[1]
    assert all(phase in description for phase in ("grpo", "rounds", "eval", "plot")), description


def test_configs_name_only_scripts_that_exist():
    named = {m for path in REPO.glob("configs/**/*.yaml")
             for m in re.findall(r"scripts/[\w./-]+\.(?:py|sh)", path.read_text(encoding="utf-8"))}
    assert named and not [m for m in named if not (REPO / m).is_file()]


def test_a_grids_print_config_starts_with_the_short_plan_and_speaks_of_gpus_only_where_there_are():
    from pipeline.stages.train import gpu_count

    proc = run_pipeline("run", "--config", "configs/small-rounds.yaml", "--print-config")
    assert proc.returncode == 0, proc.stderr
    head = proc.stdout.splitlines()[:3]
    assert head[0].startswith("# plan (phases run in the order teacher -> filter -> train"), head
    assert head[1].startswith("#    1. teacher  generate")
    if gpu_count() == 0:
        assert "of each GPU's memory" not in proc.stdout and "vLLM's CPU build: this node has no GPU" in proc.stdout


def test_compare_exemplars_adds_a_prompted_eval_per_set_in_its_own_folder_for_the_plots_table():
    proc = run_pipeline("run", "--config", "configs/small-rounds.yaml", "compare_exemplars=[paper]", "--print-config")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(r"#\s+\d+\. eval     eval: smollm2-135m prompted with the paper's exemplars", out)
    unit = out[out.index("] eval: eval: smollm2-135m prompted with the paper's exemplars\n"):]  # its config
    unit = unit[:unit.index("\n# [")]
    assert "out_dir: runs/small-rounds/eval/smollm2-135m-prompt-paper" in unit and "  exemplars: paper" in unit
    plot = out[out.rindex("plot: figure 3 and the table"):]
    assert "exemplar_comparison:\n- runs/small-rounds/eval/smollm2-135m-prompt-paper/summary.json" in plot
    assert "smollm2-135m-prompt-paper/summary.json" not in plot[:plot.index("exemplar_comparison:")]  # not in figure 3


@pytest.mark.parametrize("config, value, pattern", [
    # the sets the line offers are only those allowed: never figure 3's own
    ("configs/small-rounds.yaml", "[ours]", r"compare_exemplars: 'ours' must be a set other than figure 3's "
                                            r"\(eval.prompting.exemplars: ours\), one of paper$"),
    ("configs/small-rounds.yaml", "[pape]", r"compare_exemplars: 'pape' must be a set other.*, one of paper; "
                                            r"did you mean 'paper'\?$"),
    ("configs/small-rounds.yaml", "[papr]", r"\(eval.prompting.exemplars: ours\), one of paper; did you mean"),
    ("configs/fever.yaml", "[papr]", r"'papr' must be a set other than figure 3's \(eval.prompting.exemplars: paper\); "
                                     r"the FEVER task has no other set: drop the key$"),
    ("configs/small-chain.yaml", "[paper]", r"compare_exemplars: \['paper'\] but no student here is prompted"),
    ("configs/fever.yaml", "[ours]", r"compare_exemplars: the FEVER task has no 'ours' exemplars \(it has: paper\)"),
])
def test_compare_exemplars_refuses_the_figures_own_set_an_unknown_one_a_set_the_task_lacks_and_no_prompted_student(
        config, value, pattern):
    refused(run_pipeline("run", "--config", config, f"compare_exemplars={value}", "--print-config"), pattern)


def test_compare_oracle_plans_the_stand_ins_generate_filter_trainings_and_evals_in_their_own_folders():
    """configs/small-real-teacher.yaml: a prompted teacher, and beside it (compare_oracle) the
    stand-in on the same questions and wiki settings, matched to the teacher's datasets, and the
    student trained and evaluated on its rows as `<student>-oracle-data`, whose evals plot keeps
    out of figure 3 (teachers.md)."""
    proc = run_pipeline("run", "--config", "configs/small-real-teacher.yaml", "--print-config")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    titles = re.findall(r"^#\s+\d+\. (\w+)\s+(.+)$", out, flags=re.M)
    assert titles[:5] == [("teacher", "generate: the teacher writes trajectories"),
                          ("teacher", "generate: the oracle stand-in (agent) on the same questions"),
                          ("teacher", "eval: gemma3-270m prompted"),
                          ("filter", "filter: correct trajectories -> SFT datasets"),
                          ("filter", "filter: the stand-in's trajectories of the teacher's questions, as many rows -> "
                                     "SFT datasets")]
    for fmt in ("standard", "cot", "act", "react"):
        assert ("train", f"train: smollm2-135m on {fmt}, the stand-in's data") in titles
        assert ("eval", f"eval: smollm2-135m fine-tuned on {fmt}, the stand-in's data") in titles
    assert len(titles) == 23

    def unit(title: str) -> str:
        text = out[out.index(f"] {title}\n"):]
        return text[:text.index("\n# [")] if "\n# [" in text else text

    teacher, stand_in = unit("teacher: generate: the teacher writes trajectories"), unit(
        "teacher: generate: the oracle stand-in (agent) on the same questions")
    assert "oracle: agent\n" in stand_in and "samples: 1\n" in stand_in and "serve: null" in stand_in
    assert "out_dir: runs/small-real-teacher/generate-oracle\n" in stand_in
    for same in ("questions: offline-bootstrap\n", "limit: 400\n", "  search: bm25\n", "  search_k: 3\n"):
        assert same in teacher and same in stand_in, same
    flt = unit("filter: filter: the stand-in's trajectories of the teacher's questions, as many rows -> SFT datasets")
    assert "- runs/small-real-teacher/generate-oracle\nfireact" in flt
    assert "match_dataset: runs/small-real-teacher/sft\nout_dir: runs/small-real-teacher/sft-oracle\n" in flt
    assert "equal_rows: false" in flt and "per_question: 1" in flt  # the grid's filter keys, not its equal_rows
    assert "equal_rows: true" in unit("filter: filter: correct trajectories -> SFT datasets")
    ft = unit("train: train: smollm2-135m on react, the stand-in's data")
    assert "student_name: smollm2-135m-oracle-data\n" in ft and "dataset_dir: runs/small-real-teacher/sft-oracle\n" in ft
    ev = unit("eval: eval: smollm2-135m fine-tuned on react, the stand-in's data")
    assert "finetuned: checkpoints/small-real-teacher/smollm2-135m-oracle-data/react/final" in ev
    assert "out_dir: runs/small-real-teacher/eval/smollm2-135m-oracle-data-ft-react\n" in ev
    plot = unit("plot: plot: figure 3 and the table")
    figure, compared = plot[:plot.index("oracle_data_comparison:")], plot[plot.index("oracle_data_comparison:"):]
    assert "oracle-data" not in figure and "eval/smollm2-135m-ft-react/summary.json" in figure
    assert compared.count("oracle-data-ft-") == 4


@pytest.mark.parametrize("config, value, pattern", [
    ("configs/small-figure3.yaml", "agent", r"compare_oracle: agent compares a model teacher's data with the "
                                            r"stand-in's, and this grid's teacher is the stand-in already"),
    ("configs/small-real-teacher.yaml", "exact", r"oracle=exact searches the gold titles, which a student in "
                                                 r"wiki.search=bm25 could not know"),
    ("configs/small-real-teacher.yaml", "agnet", r"the oracle stand-in \(agnet\).*oracle must be one of exact, agent"),
    ("configs/small-real-teacher.yaml", "agent students[0].finetune=false",
     r"compare_oracle: agent but no student here is trained"),
])
def test_compare_oracle_is_refused_in_one_line_where_it_cannot_apply_and_nothing_is_written(
        config, value, pattern, tmp_path, capsys, monkeypatch):
    from pipeline.cli import main

    monkeypatch.chdir(REPO)
    key, *more = value.split()
    if more:  # a student entry changed: a copy of the config
        import yaml

        data = yaml.safe_load((REPO / config).read_text())
        data["students"][0]["finetune"] = False
        config = str(tmp_path / "grid.yaml")
        Path(config).write_text(yaml.safe_dump(data))
    code = main(["run", "--config", config, f"compare_oracle={key}", f"out_dir={tmp_path / 'run'}",
                 f"train.output_root={tmp_path / 'ckpt'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    assert re.search(pattern, err), err
    assert not (tmp_path / "run").exists() and not (tmp_path / "ckpt").exists()


# -------------------------------------------------------------------------- plans checked when made


@pytest.mark.parametrize("override, pattern", [
    ("eval.questions=offline-evl", r"eval: smollm2-135m prompted: unknown question set 'offline-evl' of HotpotQA"),
    ("grpo.settings.per_device_batch_size=3", r"grpo: smollm2-135m from its react fine-tune: .* per_device_batch_size=3"),
    ("self_training.questions=offline-bootstrp", r"generate \(round 2\).*unknown question set 'offline-bootstrp' of HotpotQA"),
    ("generate.methods=[reactt]", r"generate: the teacher writes trajectories: .*reactt"),
    ("train.student=/nonexistent/llama", r"train: smollm2-135m on standard: student: /nonexistent/llama not found"),
    # values that silently changed the plan: a stranger in grpo.students (no GRPO at all), a key
    # `run` sets itself (replaced by the unit's own)
    ("grpo.students=[smollm2]", r"grpo.students: \['smollm2'\] are not students trained here \(smollm2-135m\)"),
    ("eval.methods=[react]", r"eval: methods is set by `run` for each unit"),
    ("--only=rounds", r"this grid has no unit in phase rounds; its phases: teacher, filter, train, eval, plot"),
])
def test_run_print_config_refuses_what_a_phase_would_refuse_hours_later(override, pattern):
    config = "configs/demo.yaml" if override.startswith("--only") else "configs/small-rounds.yaml"
    refused(run_pipeline("run", "--config", config, override, "--print-config"), pattern)


def two_students(first_name: str | None, second_name: str | None, second_lora: bool = True) -> str:
    """A `students=` override: two students of one base model (a full fine-tune and a LoRA),
    each prompting it, its prompt_model labelled by `*_name` (None: the model's own label)."""
    def student(name: str, label: str | None, train: str) -> str:
        model = "{backend: transformers, model: smollm2" + (f", name: {label}" if label else "") + "}"
        return (f"{{name: {name}, config: configs/students/smollm2-135m.yaml, size_class: 135m, params_b: 0.135, "
                f"prompt_model: {model}, train: {train}}}")
    return (f"students=[{student('full', first_name, '{max_steps: 2}')}, "
            f"{student('lora', second_name, '{max_steps: 2, finetuning: lora}' if second_lora else '{max_steps: 2}')}]")


@pytest.mark.parametrize("first, second, pattern", [
    (None, None, r"students 'full' and 'lora' both prompt smollm2 \(standard on offline-eval\): the same "
                 r"row twice, which plot refuses; set `prompt_model: \{\}` on 'lora', or give each prompt_model a `name`"),
    ("SmolLM2", "SmolLM2", r"students 'full' and 'lora' both prompt SmolLM2 \("),
    (None, "smollm2", r"both prompt smollm2 \("),  # a name equal to the model's own label is the same row
])
def test_two_students_prompting_one_base_model_are_refused_when_the_plan_is_made(first, second, pattern):
    """They ended at `plot`, which refused the duplicated prompted row after every eval had run."""
    refused(run_pipeline("run", "--config", "configs/demo.yaml", two_students(first, second), "--print-config"), pattern)


def test_two_students_given_one_released_model_are_refused_when_the_plan_is_made():
    """The same class: two students evaluating one `finetuned` model write one row twice."""
    twice = ("students=[{name: a, finetuned: forestai/fireact_llama_2_7b_lora}, "
             "{name: b, finetuned: forestai/fireact_llama_2_7b_lora}]")
    refused(run_pipeline("run", "--config", "configs/demo.yaml", twice, "--print-config"),
            r"students 'a' and 'b' both evaluate FireAct Llama-2-7B LoRA \(released\) \(its own format on "
            r"offline-eval\): the same row twice, which plot refuses; drop student 'b', or give each an `eval: ")


def test_two_students_on_one_base_model_with_named_prompted_rows_plan_both():
    proc = run_pipeline("run", "--config", "configs/demo.yaml", two_students("SmolLM2 (a)", "SmolLM2 (b)"),
                        "--print-config")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "eval: full prompted" in proc.stdout and "eval: lora prompted" in proc.stdout


def test_grpo_dry_run_refuses_a_start_that_does_not_exist(tmp_path):
    """A dry run exit 0 means the real one starts: the start is checked without loading it."""
    proc = run_pipeline("grpo", "--config", GRPO_YAML, f"student={tmp_path / 'nope' / 'final'}",
                        f"output_root={tmp_path}", "--dry-run")
    refused(proc, r"student: .*nope/final not found")
