"""The one owner of the trajectory text format (paper appendix, ReAct repo prompts).

The same text is used to prompt a teacher (after exemplars), as SFT training data, and as the
zero-shot format a fine-tuned student decodes. Formats, for a question Q (the question line's
first word is the task's: `Question:` for HotpotQA, `Claim:` for FEVER):

  standard  Question: Q\nAnswer: A\n
  cot       Question: Q\nThought: Let's think step by step. R\nAnswer: A\n
  act       Question: Q\nAction 1: Search[x]\nObservation 1: ...\n...Action n: Finish[A]\nObservation n: Episode finished, reward = 1\n
  react     Question: Q\nThought 1: ...\nAction 1: Search[x]\nObservation 1: ...\n...

`render` splits the text into the prompt (the question line) and the completion (everything the
model must produce), and gives the character spans of observation text inside the completion,
so training can mask them (`mask_observations`) without re-parsing.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

FORMATS = ("standard", "cot", "act", "react")  # trajectory formats: what a student is trained to decode
COT_PREFIX = "Let's think step by step. "
QUESTION_LABEL = "Question"  # the question line's first word unless a task says otherwise


@dataclass
class Step:
    thought: str | None = None
    action: str | None = None
    observation: str | None = None


@dataclass
class Trajectory:
    question: str
    format: str  # one of FORMATS (the key "format"; "method" in records written before the rename)
    steps: list[Step] = field(default_factory=list)  # act / react
    answer: str | None = None  # standard / cot answer line; act / react Finish argument
    reasoning: str | None = None  # cot only, the text after "Let's think step by step."
    question_label: str = QUESTION_LABEL  # the question line's first word (the task's: "Claim" for FEVER)

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["question_label"] == QUESTION_LABEL:  # HotpotQA's records stay as they were written
            del d["question_label"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Trajectory:
        """A trajectory dict as to_dict writes it, or as written before the rename (its format
        under the key "method")."""
        steps = [Step(**s) for s in d.get("steps") or []]
        fmt = d["format"] if "format" in d else d["method"]
        return cls(d["question"], fmt, steps, d.get("answer"), d.get("reasoning"),
                   d.get("question_label") or QUESTION_LABEL)


@dataclass
class Rendered:
    prompt: str  # the question line, "Question: ...\n"
    completion: str  # what the model decodes
    observation_spans: list[tuple[int, int]]  # [start, end) inside `completion`

    @property
    def text(self) -> str:
        return self.prompt + self.completion


def question_line(question: str, label: str = QUESTION_LABEL) -> str:
    return f"{label}: {one_line(question)}\n"


def one_line(text: str) -> str:
    """Observations and thoughts are single lines in the format (the original strips newlines)."""
    return re.sub(r"\s*\n\s*", " ", text).strip()


def render(traj: Trajectory) -> Rendered:
    if traj.format not in FORMATS:
        raise ValueError(f"unknown format {traj.format!r}; expected one of {FORMATS}")
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    offset = 0

    def add(text: str, observation: bool = False) -> None:
        nonlocal offset
        if observation:
            spans.append((offset, offset + len(text)))
        parts.append(text)
        offset += len(text)

    if traj.format == "standard":
        add(f"Answer: {one_line(traj.answer or '')}\n")
    elif traj.format == "cot":
        add(f"Thought: {COT_PREFIX}{one_line(traj.reasoning or '')}\n")
        add(f"Answer: {one_line(traj.answer or '')}\n")
    else:
        for i, step in enumerate(traj.steps, start=1):
            if traj.format == "react":
                add(f"Thought {i}: {one_line(step.thought or '')}\n")
            add(f"Action {i}: {one_line(step.action or '')}\n")
            if step.observation is not None:
                add(f"Observation {i}: ")
                add(one_line(step.observation), observation=True)
                add("\n")
    return Rendered(question_line(traj.question, traj.question_label), "".join(parts), spans)


_STEP_LINE = re.compile(r"^(Thought|Action|Observation)(?: (\d+))?: ?(.*)$")


def parse(text: str, fmt: str, question_label: str = QUESTION_LABEL) -> Trajectory:
    """Parse rendered text (ours, or the paper's exemplars) back into a Trajectory."""
    lines = [ln for ln in text.strip("\n").split("\n") if ln.strip()]
    head = f"{question_label}:"
    if not lines or not lines[0].startswith(head):
        raise ValueError(f"trajectory text must start with '{head}'")
    traj = Trajectory(question=lines[0][len(head):].strip(), format=fmt, question_label=question_label)
    for line in lines[1:]:
        if line.startswith("Answer:"):
            traj.answer = line[len("Answer:"):].strip()
            continue
        m = _STEP_LINE.match(line)
        if not m:
            continue_last_field(traj, line)  # the paper's exemplars wrap some observations
            continue
        kind, _, body = m.groups()
        if fmt == "cot" and kind == "Thought":
            traj.reasoning = body[len(COT_PREFIX):] if body.startswith(COT_PREFIX) else body
        elif kind == "Thought" or (kind == "Action" and fmt == "act"):
            traj.steps.append(Step())
        if kind == "Thought" and fmt != "cot":
            traj.steps[-1].thought = body
        elif kind == "Action":
            if not traj.steps:
                traj.steps.append(Step())
            traj.steps[-1].action = body
            finish = re.fullmatch(r"[Ff]inish\[(.*)\]", body.strip())
            if finish:
                traj.answer = finish.group(1)
        elif kind == "Observation" and traj.steps:
            traj.steps[-1].observation = body
    return traj


def continue_last_field(traj: Trajectory, line: str) -> None:
    """Append a wrapped line to the field it continues (an observation, in practice)."""
    if traj.steps:
        step = traj.steps[-1]
        for name in ("observation", "action", "thought"):
            value = getattr(step, name)
            if value is not None:
                setattr(step, name, f"{value} {line.strip()}")
                return
    elif traj.format == "cot" and traj.reasoning is not None:
        traj.reasoning = f"{traj.reasoning} {line.strip()}"
