"""A small synthetic world for the GRPO tests, where learning is certain within a few dozen steps.

Sixteen pages, one per made-up name, each saying the name's colour ("The colour of alpha is
gold."); a question per page ("What colour is alpha?"). A ReAct episode that solves it searches
the name and copies the colour from the first observation into Finish[...]. The policy is a tiny
Llama with a byte-level BPE tokenizer trained here on the world's text (`tokenizers`), warm-started
by SFT on trajectories rendered by pipeline.core.trajectory in which only a share (`copy_rate`) of the
answers copies the observation: the rest name a colour at random. So the warm start knows the
format and answers right about copy_rate + (1 - copy_rate) / 4 of the time; GRPO has to learn to
copy. Real parts throughout: a real SQLite index, the real tokenizer and model classes.

The FEVER world (`build_fever_world`) has the same pages, but its colours are gold or red, half
and half, and its questions are FEVER claims, "The colour of alpha is gold.", labelled SUPPORTS
where the page says gold and REFUTES where it says red: an episode that solves it searches the
name and maps the observed colour to the label. Its warm start (`warm_start(..., task="fever")`)
answers the right label `copy_rate` of the time, the other label otherwise.

Not a test module: `from rl_testdata import ...` from tests/.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

NAMES = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
         "kilo", "lima", "mike", "november", "oscar", "papa"]
COLOURS = ["red", "blue", "green", "gold"]
DIMS = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "intermediate_size": 128, "max_position_embeddings": 256, "tie_word_embeddings": True}


@dataclass
class World:
    corpus: Path
    index: Path
    questions: Path
    colour: dict[str, str]


def build_world(folder: Path, seed: int = 0) -> World:
    rng = random.Random(seed)
    colour = {name: rng.choice(COLOURS) for name in NAMES}
    rows = [{"_id": f"q-{n}", "question": f"What colour is {n}?", "answer": c} for n, c in colour.items()]
    return write_world(folder, colour, "questions.jsonl", rows)


FEVER_COLOURS = ["gold", "red"]  # gold: the claim holds (SUPPORTS); red: it does not (REFUTES)


def fever_label(colour: str) -> str:
    return "SUPPORTS" if colour == "gold" else "REFUTES"


def build_fever_world(folder: Path, seed: int = 0) -> World:
    """The FEVER world (module docstring): its index and a FEVER claims file (id, claim, label)."""
    names = list(NAMES)
    random.Random(seed).shuffle(names)
    colour = {name: FEVER_COLOURS[i % 2] for i, name in enumerate(names)}
    rows = [{"id": f"c-{n}", "claim": f"The colour of {n} is gold.", "label": fever_label(c)} for n, c in colour.items()]
    return write_world(folder, colour, "claims.jsonl", rows)


def write_world(folder: Path, colour: dict[str, str], questions_name: str, rows: list[dict]) -> World:
    """A page per name saying its colour (a real SQLite index over them) and the questions file."""
    from pipeline.wiki.index import build_index

    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"title": n, "sentences": [f"The colour of {n} is {c}."]}) + "\n"
                              for n, c in colour.items()), encoding="utf-8")
    index = folder / "index.sqlite"
    build_index([corpus], index)
    questions = folder / questions_name
    questions.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return World(corpus, index, questions, colour)


def episode_text(question: str, name: str, colour: str, thought: str, answer: str, reward: int,
                 label: str = "Question"):
    """The rendered (prompt, completion) of one episode: Search[name], then Finish[answer]."""
    from pipeline.core.trajectory import Step, Trajectory, render

    traj = Trajectory(question, "react", [
        Step(f"I search {name}.", f"Search[{name}]", f"The colour of {name} is {colour}."),
        Step(thought, f"Finish[{answer}]", f"Episode finished, reward = {reward}"),
    ], answer=answer, question_label=label)
    rendered = render(traj)
    return rendered.prompt, rendered.completion


def react_text(name: str, colour: str, answer: str):
    """One episode of the colour world answering `answer`."""
    return episode_text(f"What colour is {name}?", name, colour, f"It is {answer}.", answer, int(answer == colour))


def fever_text(name: str, colour: str, answer: str):
    """One episode of the FEVER world answering the label `answer` (its thought names the colour seen)."""
    return episode_text(f"The colour of {name} is gold.", name, colour, f"It is {colour}.", answer,
                        int(answer == fever_label(colour)), "Claim")


def warm_start_examples(world: World, copy_rate: float, n: int, seed: int = 0,
                        task: str = "hotpotqa") -> list[tuple[str, str]]:
    """n episodes answering right `copy_rate` of the time, else a random answer of the world's."""
    fever = task == "fever"
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        name = rng.choice(NAMES)
        colour = world.colour[name]
        right = fever_label(colour) if fever else colour
        answer = right if rng.random() < copy_rate else rng.choice(["SUPPORTS", "REFUTES"] if fever else COLOURS)
        out.append((fever_text if fever else react_text)(name, colour, answer))
    return out


def train_tokenizer(texts: list[str]):
    """A small BPE tokenizer trained on `texts`, its pre-tokenizer splitting words, single
    whitespace characters and punctuation apart: each word of the world becomes one token, the
    same token in "What colour is alpha?" and in "Search[alpha]" (copying it is the easiest thing
    a tiny model learns), and any other ASCII text falls back to single characters, so everything
    the environment says encodes and decodes back exactly."""
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE), behavior="isolated")
    tok.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=list(string.printable))
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


PIECE = r"\w+|\s|[^\w\s]"  # a word, one whitespace character, or one other character
# Everything the environment can say besides the pages (misses, invalid actions, the end).
ENV_TEXT = ("Invalid action: Could not find . Similar: ['', ''] [] Episode finished, reward = 0 1 No more results. "
            "(Result 1 / 2) Episode already finished. Nice thought. Thought Action Observation Search Lookup Finish "
            "search lookup finish think Question 3 4 5 6 7 8 9")


def warm_start(world: World, out: Path, *, copy_rate: float = 0.3, steps: int = 300, lr: float = 3e-3,
               seed: int = 0, task: str = "hotpotqa") -> Path:
    """A tiny Llama SFT-trained on warm-start trajectories of `task`'s world (plain torch, a few
    seconds), saved with its tokenizer as a model folder: a base model for `grpo student=<out>`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    fever = task == "fever"
    examples = warm_start_examples(world, copy_rate, 512, seed, task)
    words = NAMES + COLOURS + (["Claim", "NOT ENOUGH INFO"] if fever else [])
    tokenizer = train_tokenizer([p + c for p, c in examples] + [ENV_TEXT, " ".join(words)])
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None, **DIMS))
    rows = []
    for prompt, completion in examples:
        p = tokenizer(prompt)["input_ids"]
        c = tokenizer(completion)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((p + c, [-100] * len(p) + c))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(seed)
    model.train()
    for _ in range(steps):
        batch = rng.sample(rows, 16)
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i, _ in batch])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
