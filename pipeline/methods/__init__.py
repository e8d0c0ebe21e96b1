"""The paper's prompting methods as small compositions (see each module), built by name for a task.

    method = build_method("react", MethodSettings(exemplars="paper"))            # HotpotQA
    method = build_method("react", MethodSettings(exemplars="paper"), "fever")   # FEVER's 3-shot prompts
    records = pipeline.agent.scheduler.run_episodes(llm, make_backend, questions, method, on_record)

Names: standard, cot, cot_sc, act, react, react_to_cot_sc, cot_sc_to_react, one row each in
pipeline.methods.registry (its formats, how it is built, how the figure draws it).
`settings.style == "zero_shot"` drops instruction and exemplars (fine-tuned students);
`settings.style == "fireact"` runs ReAct in FireAct's format (pipeline.methods.fireact: the
Alpaca wrapper, unnumbered lines), the way FireAct's released agents decode.
"""

from __future__ import annotations

from pipeline.core.errors import PipelineError
from pipeline.methods.base import EpisodeContext, Method, MethodSettings, Outcome, Program
from pipeline.methods.prompts import PromptPrefix, load_prompt, zero_shot
from pipeline.methods.registry import METHODS, MethodSpec, method_spec
from pipeline.tasks import Task

# Read from the registry (pipeline.methods.registry), for callers that ask by name.
METHOD_NAMES = tuple(spec.name for spec in METHODS)
FORMATS_USED = {spec.name: spec.formats for spec in METHODS}  # the formats each method prompts with
STYLES = ("prompt", "zero_shot", "fireact")
LOOPS = ("ours", "original")
INTERFACES = ("text", "tools")  # prompting.interface: the paper's text, or native tool calls

__all__ = ["METHODS", "METHOD_NAMES", "EpisodeContext", "Method", "MethodSettings", "MethodSpec", "Outcome",
           "Program", "build_method", "method_spec", "prompt_prefixes"]


def prompt_prefixes(name: str, settings: MethodSettings, task: Task | str | None = None,
                    search: str = "title") -> dict[str, PromptPrefix]:
    """The prefix of each format `name` uses for `task` (a pipeline.tasks name or Task; default
    HotpotQA) in the wiki.search mode `search` (its own exemplar sets), for the manifest's
    exemplar source too."""
    from pipeline.tasks import get_task

    task = get_task(task)
    check_method(name, settings, task)
    if settings.style == "fireact":
        from pipeline.methods.fireact import SOURCE

        return {"react": PromptPrefix("react", "", "", SOURCE)}
    formats = method_spec(name).formats
    if settings.interface == "tools":  # no exemplars: the chat template lists the tools
        return {fmt: PromptPrefix(fmt, "", "", "none: native tool calls (prompting.interface=tools)") for fmt in formats}
    if settings.style == "zero_shot":
        return {fmt: zero_shot(fmt) for fmt in formats}
    return {fmt: load_prompt(fmt, settings.exemplars, task, search) for fmt in formats}


def build_method(name: str, settings: MethodSettings | None = None, task: Task | str | None = None,
                 search: str = "title") -> Method:
    """Method `name` prompting for `task` (default HotpotQA), whose metric scores its records,
    with the exemplars of the wiki.search mode `search`."""
    from pipeline.tasks import get_task

    settings, task = settings or MethodSettings(), get_task(task)
    p = prompt_prefixes(name, settings, task, search)
    if settings.style == "fireact":
        from pipeline.methods.fireact import FireActReAct

        return FireActReAct(settings)
    if settings.interface == "tools":
        from pipeline.methods.tool_calling import ToolCalling

        return ToolCalling(name, settings, task, search)
    spec = method_spec(name)
    return spec.build(*(p[fmt] for fmt in spec.formats), settings, task)


def check_style(style: str) -> None:
    if style not in STYLES:
        raise PipelineError(f"unknown prompting style '{style}' (prompting.style); expected one of {', '.join(STYLES)}")


def check_method(name: str, settings: MethodSettings, task: Task | None = None) -> None:
    method_spec(name)  # an unknown name: an error listing the known ones
    check_style(settings.style)
    if settings.loop not in LOOPS:
        raise PipelineError(f"unknown loop '{settings.loop}'; expected one of {', '.join(LOOPS)}")
    if settings.style == "fireact" and name != "react":
        raise PipelineError(f"FireAct's format is ReAct only; it cannot run '{name}' (set methods=[react])")
    if settings.style == "fireact" and task is not None and task.name != "hotpotqa":
        raise PipelineError(f"FireAct's format was trained on HotpotQA questions; it does not run the {task.title} task")
    if settings.interface not in INTERFACES:
        raise PipelineError(f"unknown prompting.interface '{settings.interface}'; expected one of {', '.join(INTERFACES)}")
    if settings.interface == "tools" and name not in ("react", "act"):
        raise PipelineError(f"prompting.interface=tools runs act and react through tool calls, not '{name}'; "
                            "set methods=[react] or [act], or interface=text")
    if settings.interface == "tools" and (settings.style == "fireact" or settings.loop == "original"):
        raise PipelineError("prompting.interface=tools sends messages, not the text that style=fireact or "
                            "loop=original prompt with; leave those at their defaults, or set interface=text")
    if settings.max_steps < 1 or settings.max_new_tokens < 1 or settings.cot_sc_samples < 1:
        raise PipelineError("max_steps, max_new_tokens and cot_sc_samples must be >= 1 "
                            f"(got {settings.max_steps}, {settings.max_new_tokens}, {settings.cot_sc_samples})")
