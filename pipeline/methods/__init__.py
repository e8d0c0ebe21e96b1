"""The paper's prompting methods as small compositions (see each module), built by name.

    method = build_method("react", MethodSettings(exemplars="paper"))
    records = pipeline.agent.run_episodes(llm, make_backend, questions, method, on_record)

Names: standard, cot, cot_sc, act, react, react_to_cot_sc, cot_sc_to_react.
`settings.mode == "zero_shot"` drops instruction and exemplars (fine-tuned students);
`settings.mode == "fireact"` runs ReAct in FireAct's format (pipeline.methods.fireact: the
Alpaca wrapper, unnumbered lines), the way FireAct's released agents decode.
"""

from __future__ import annotations

from pipeline.errors import PipelineError
from pipeline.methods.base import EpisodeContext, Method, MethodSettings, Outcome, Program
from pipeline.methods.composed import Fallback, SelfConsistency, no_answer, weak_majority
from pipeline.methods.direct import Direct
from pipeline.methods.interactive import Interactive
from pipeline.methods.prompts import PromptPrefix, load_prompt, zero_shot

METHOD_NAMES = ("standard", "cot", "cot_sc", "act", "react", "react_to_cot_sc", "cot_sc_to_react")
MODES = ("prompt", "zero_shot", "fireact")
LOOPS = ("ours", "original")
# The trajectory formats (pipeline.trajectory.FORMATS) each method prompts with.
FORMATS_USED = {"standard": ("standard",), "cot": ("cot",), "cot_sc": ("cot",), "act": ("act",),
                "react": ("react",), "react_to_cot_sc": ("react", "cot"),
                "cot_sc_to_react": ("cot", "react")}

__all__ = ["METHOD_NAMES", "EpisodeContext", "Method", "MethodSettings", "Outcome", "Program",
           "build_method", "prompt_prefixes"]


def prompt_prefixes(name: str, settings: MethodSettings) -> dict[str, PromptPrefix]:
    """The prefix of each format `name` uses (for the manifest's exemplar source, too)."""
    check_method(name, settings)
    if settings.mode == "fireact":
        from pipeline.methods.fireact import SOURCE

        return {"react": PromptPrefix("react", "", "", SOURCE)}
    if settings.mode == "zero_shot":
        return {fmt: zero_shot(fmt) for fmt in FORMATS_USED[name]}
    return {fmt: load_prompt(fmt, settings.exemplars) for fmt in FORMATS_USED[name]}


def build_method(name: str, settings: MethodSettings | None = None) -> Method:
    settings = settings or MethodSettings()
    p = prompt_prefixes(name, settings)
    if settings.mode == "fireact":
        from pipeline.methods.fireact import FireActReAct

        return FireActReAct(settings)
    if name in ("standard", "cot"):
        return Direct(p[name], settings)
    if name in ("act", "react"):
        return Interactive(p[name], settings)
    if name == "cot_sc":
        return SelfConsistency(p["cot"], settings)
    if name == "react_to_cot_sc":
        return Fallback(name, Interactive(p["react"], settings), SelfConsistency(p["cot"], settings),
                        no_answer)
    return Fallback(name, SelfConsistency(p["cot"], settings), Interactive(p["react"], settings),
                    weak_majority)


def check_method(name: str, settings: MethodSettings) -> None:
    if name not in METHOD_NAMES:
        raise PipelineError(f"unknown method '{name}'; expected one of {', '.join(METHOD_NAMES)}")
    if settings.mode not in MODES:
        raise PipelineError(f"unknown mode '{settings.mode}'; expected one of {', '.join(MODES)}")
    if settings.loop not in LOOPS:
        raise PipelineError(f"unknown loop '{settings.loop}'; expected one of {', '.join(LOOPS)}")
    if settings.mode == "fireact" and name != "react":
        raise PipelineError(f"FireAct's format is ReAct only; it cannot run '{name}' (set methods=[react])")
    if settings.max_steps < 1 or settings.max_new_tokens < 1 or settings.cot_sc_samples < 1:
        raise PipelineError("max_steps, max_new_tokens and cot_sc_samples must be >= 1 "
                            f"(got {settings.max_steps}, {settings.max_new_tokens}, {settings.cot_sc_samples})")
