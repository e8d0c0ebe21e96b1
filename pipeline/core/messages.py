"""The one owner of the messages layout: a trajectory as chat messages with tool calls.

pipeline.core.trajectory renders a trajectory as the paper's text; this module writes the same
trajectory the way chat models and their trainers take it (TRL's SFTTrainer, verl, the
OpenAI-compatible APIs): `messages` with `tool_calls` and `role: tool` results, and `tools`, the
JSON schemas of the environment's three actions. For a question Q with the question line
`Question: Q` (FEVER: `Claim: Q`):

  react     user "Question: Q"
            assistant content = thought 1, tool_calls = [search {"entity": ...}]
            tool      content = observation 1
            ...
            assistant content = thought n, tool_calls = [finish {"answer": A}]     (the last message)
  act       the same with content "" (no thoughts)
  cot       user "Question: Q", assistant "Let's think step by step. R\\nAnswer: A"
  standard  user "Question: Q", assistant "A"

The final answer is a `finish` tool call, and the conversation ends there: the environment's
reply to Finish (`Episode finished, reward = 1`) is not written, since an agent's episode ends
at the call and no model reads what follows. Thoughts, observations and answers are the
renderer's single lines (`one_line`), so both layouts of one dataset hold the same words. An
action is written as the environment parses it (pipeline/wiki/actions.py: the name in any case,
the argument from the first `[` to the last `]`, stripped); a step whose action the environment
would refuse (`Invalid action`) has no tool call to become, and `to_messages` raises
`NotToolCalls` with a reason. `arguments` is an object, as transformers' chat templates take it
(OpenAI's API sends a JSON string: `from_messages` reads either).

    python -c "from pipeline.core.messages import tool_schemas; import json; print(json.dumps(tool_schemas(), indent=1))"
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from pipeline.core.trajectory import (
    COT_PREFIX,
    QUESTION_LABEL,
    Step,
    Trajectory,
    one_line,
    parse,
    question_line,
    render,
)

# Each tool takes one string argument, named for what the environment does with it.
PARAMETERS = {"search": "entity", "lookup": "keyword", "finish": "answer"}
ACTION_TEXT = {"search": "Search", "lookup": "Lookup", "finish": "Finish"}  # the text layout's spelling
DESCRIPTIONS = {
    "search": ("Search Wikipedia for an entity. Returns the first five sentences of its page, or, when "
               "there is no such page, similar titles to search instead."),
    "lookup": ("Look up a keyword on the page last searched. Returns the next sentence that contains it, "
               "as (Result k / n); a new keyword starts again from the first."),
    "finish": "Give the final answer. Ends the episode.",
}
PARAMETER_TEXT = {"entity": "the page title to search", "keyword": "the word or phrase to find on the current page",
                  "answer": "the final answer"}
# wiki.search=bm25 (a retriever over the local index, pipeline/wiki/env.py): what its Search does
RETRIEVER = {
    "search": ("Search Wikipedia with a query. Returns the best-matching pages (3 by default), each as "
               "(i) Title: its first five sentences."),
    "lookup": ("Look up a keyword in the pages last retrieved. Returns the next sentence that contains it, "
               "as (Result k / n); a new keyword starts again from the first."),
    "entity": "the words to search for",
}
# wiki/actions.py's rule (core/ imports nothing above it; tests/test_messages.py holds the two equal).
_ACTION = re.compile(r"^\s*([A-Za-z]+)\s*\[(.*)\]\s*$", re.DOTALL)
_COT_ANSWER = "\nAnswer: "


class NotToolCalls(ValueError):
    """A trajectory (or a conversation) that the other layout cannot hold; `reason` names why."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def tool_schemas(answer_space: tuple[str, ...] | None = None, search: str = "title") -> list[dict[str, Any]]:
    """The `tools` column: search, lookup and finish as OpenAI-style function schemas. A task with
    a closed answer space (FEVER's three labels) gets them as finish's `enum`; `search` is the
    environment's search mode (wiki.search: title, the paper's, or bm25, a retriever), which the
    descriptions say."""
    words = {**DESCRIPTIONS, **PARAMETER_TEXT, **(RETRIEVER if search == "bm25" else {})}
    tools = []
    for name, parameter in PARAMETERS.items():
        prop: dict[str, Any] = {"type": "string", "description": words[parameter]}
        if name == "finish" and answer_space:
            prop["enum"] = list(answer_space)
        tools.append({"type": "function", "function": {
            "name": name, "description": words[name],
            "parameters": {"type": "object", "properties": {parameter: prop}, "required": [parameter]}}})
    return tools


def tool_call(action: str, call_id: str, answer_space: tuple[str, ...] | None = None) -> dict[str, Any]:
    """`Search[x]` -> {"id", "type": "function", "function": {"name": "search", "arguments": {"entity": "x"}}}."""
    match = _ACTION.match(action or "")
    name = match.group(1).lower() if match else None
    if name not in PARAMETERS:
        raise NotToolCalls("action_not_a_tool", repr(action))
    argument = match.group(2).strip()
    if name == "finish" and answer_space:
        argument = _in_answer_space(argument, answer_space)
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": {PARAMETERS[name]: argument}}}


def _in_answer_space(answer: str, answer_space: tuple[str, ...]) -> str:
    """FEVER's `Finish[supports]` is correct (the task normalises); its schema's enum says SUPPORTS."""
    def key(text: str) -> str:
        return " ".join(re.findall(r"\w+", text.upper()))

    return next((label for label in answer_space if key(label) == key(answer)), answer)


def answer_content(traj: Trajectory) -> str:
    """Standard's and CoT's one assistant turn: the answer, after CoT's reasoning."""
    answer = one_line(traj.answer or "")
    if traj.format == "cot":
        return f"{COT_PREFIX}{one_line(traj.reasoning or '')}{_COT_ANSWER}{answer}"
    return answer


def to_messages(traj: Trajectory, *, system: str | None = None,
                answer_space: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The trajectory as chat messages (the module docstring); raises NotToolCalls for a step
    that is not a search, lookup or finish call, or that lacks its observation before the end."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": question_line(traj.question, traj.question_label).rstrip("\n")})
    if traj.format in ("standard", "cot"):
        return [*messages, {"role": "assistant", "content": answer_content(traj)}]
    for i, step in enumerate(traj.steps, start=1):
        call = tool_call(step.action or "", f"call_{i}", answer_space)
        thought = one_line(step.thought or "") if traj.format == "react" else ""
        messages.append({"role": "assistant", "content": thought, "tool_calls": [call]})
        name = call["function"]["name"]
        if name == "finish":
            if i != len(traj.steps):
                raise NotToolCalls("finish_not_last", f"step {i} of {len(traj.steps)}")
            break
        if step.observation is None:
            if i == len(traj.steps):  # an unfinished trajectory ends on its last call
                break
            raise NotToolCalls("missing_observation", f"step {i}")
        messages.append({"role": "tool", "tool_call_id": call["id"], "name": name,
                         "content": one_line(step.observation)})
    return messages


def dataset_rows(rows: list[dict[str, Any]], *, question_label: str = QUESTION_LABEL,
                 answer_space: tuple[str, ...] | None = None, search: str = "title") -> tuple[list[dict[str, Any]], Counter]:
    """An SFT dataset's rows (filter's train.jsonl: prompt, completion) in the messages layout,
    row for row in the same order: {id, question, method, messages, tools, answer, source}; and
    why the rows left out were left out (NotToolCalls' reasons). Each row's trajectory is read
    back from its text, so the two files hold the same trajectories whatever built the rows (new
    episodes, or the rows of an earlier round's dataset). `search`: the wiki.search mode the
    trajectories were generated in, which the `search` tool's description says (tool_schemas)."""
    out, left_out = [], Counter()
    tools = tool_schemas(answer_space, search)
    for row in rows:
        text = row["prompt"] + row["completion"]
        try:
            traj = parse(text, row["method"], question_label)
        except ValueError:  # e.g. not the task's question line
            traj = None
        if traj is None or render(traj).text != text:  # the renderer and the parser disagree: never write a guess
            left_out["text_does_not_parse"] += 1
            continue
        try:
            messages = to_messages(traj, answer_space=answer_space)
        except NotToolCalls as exc:
            left_out[exc.reason] += 1
            continue
        out.append({"id": row["id"], "question": row["question"], "method": row["method"], "messages": messages,
                    "tools": tools if traj.format in ("act", "react") else [],
                    "answer": row.get("answer"), "source": row.get("source")})
    return out, left_out


# ---------------------------------------------------------------- reading messages back


def from_messages(messages: list[dict[str, Any]], *, question_label: str = QUESTION_LABEL) -> tuple[Trajectory, str | None]:
    """A conversation with tool calls -> (the trajectory, the finish call's tool result or None).

    The first user message is the question (its `Question: ` label, when there, is dropped);
    each assistant turn with one tool call is a step (its content the thought); a `role: tool`
    message is the observation of the step before it; a last assistant turn without a tool call
    and no steps before it is a Standard or CoT answer. Raises NotToolCalls for anything else."""
    turns = [m for m in messages if m.get("role") != "system"]
    if not turns or turns[0].get("role") != "user":
        raise NotToolCalls("no_question", "the first message after the system prompt is not the user's")
    question = _text(turns[0])
    if question.startswith(f"{question_label}:"):
        question = question[len(question_label) + 1:].strip()
    steps: list[Step] = []
    finish_result = None
    for n, message in enumerate(turns[1:], start=2):
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            if steps and steps[-1].action and steps[-1].action.startswith("Finish["):
                raise NotToolCalls("finish_not_last", f"message {n}")
            steps.append(reply_step(_text(message), message["tool_calls"], f"message {n}"))
        elif role == "assistant":
            if n != len(turns) or steps:
                raise NotToolCalls("no_tool_call", f"message {n}: an assistant turn without a tool call")
            return _answer_trajectory(question, _text(message), question_label), None
        elif role == "tool":
            finished = bool(steps) and steps[-1].action.startswith("Finish[")
            if not steps or steps[-1].observation is not None or (finished and finish_result is not None):
                raise NotToolCalls("tool_result_without_call", f"message {n}")
            if finished:
                finish_result = _text(message)
            else:
                steps[-1].observation = _text(message)
        else:
            raise NotToolCalls("unexpected_role", f"message {n}: role {role!r}")
    if not steps:
        raise NotToolCalls("no_answer", "the conversation has no assistant turn")
    return _tool_trajectory(question, steps, question_label), finish_result


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def reply_step(content: str | None, tool_calls: Any, where: str = "the reply") -> Step:
    """An assistant turn (its content and tool calls) -> the step it takes: its content the
    thought, its one call the action as the text layout writes it (`search {"entity": "x"}` ->
    `Search[x]`). Raises NotToolCalls: `no_tool_call`, `several_tool_calls`, `unknown_tool`,
    `bad_arguments` (not JSON, or not the tool's one string)."""
    if not tool_calls:
        raise NotToolCalls("no_tool_call", f"{where}: an assistant turn without a tool call")
    if not isinstance(tool_calls, list) or len(tool_calls) != 1 or not isinstance(tool_calls[0], dict):
        count = len(tool_calls) if isinstance(tool_calls, list) else "malformed"
        raise NotToolCalls("several_tool_calls" if isinstance(tool_calls, list) else "bad_arguments",
                           f"{where}: {count} calls in one turn; a step acts once")
    function = tool_calls[0].get("function") or tool_calls[0]
    name, arguments = function.get("name"), function.get("arguments")
    if name not in PARAMETERS:
        raise NotToolCalls("unknown_tool", f"{where}: {name!r} is not one of {', '.join(PARAMETERS)}")
    if isinstance(arguments, str):  # OpenAI's API sends arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise NotToolCalls("bad_arguments", f"{where}: not JSON: {arguments[:80]!r}") from None
    value = arguments.get(PARAMETERS[name]) if isinstance(arguments, dict) else None
    if not isinstance(value, str):
        raise NotToolCalls("bad_arguments", f"{where}: {name} needs {{{PARAMETERS[name]!r}: <string>}}")
    thought = one_line(content or "")
    return Step(thought=thought or None, action=f"{ACTION_TEXT[name]}[{value.strip()}]")


def wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as an OpenAI-compatible chat endpoint takes them: each tool call's
    `arguments` a JSON string (this layout keeps them as objects, as chat templates take them)."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            calls = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"],
                                                                                 ensure_ascii=False)}}
                     for c in calls]
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out


def _tool_trajectory(question: str, steps: list[Step], question_label: str) -> Trajectory:
    thoughts = [step.thought is not None for step in steps]
    if any(thoughts) and not all(thoughts):
        raise NotToolCalls("mixed_thoughts", "some tool calls come with a thought and some without")
    fmt = "react" if all(thoughts) else "act"
    last = _ACTION.match(steps[-1].action)
    answer = last.group(2) if last.group(1) == "Finish" else None
    return Trajectory(question, fmt, steps, answer, question_label=question_label)


def _answer_trajectory(question: str, content: str, question_label: str) -> Trajectory:
    if content.startswith(COT_PREFIX) and _COT_ANSWER in content:
        reasoning, answer = content[len(COT_PREFIX):].rsplit(_COT_ANSWER, 1)
        return Trajectory(question, "cot", [], answer.strip(), reasoning.strip(), question_label)
    return Trajectory(question, "standard", [], content.strip(), question_label=question_label)
