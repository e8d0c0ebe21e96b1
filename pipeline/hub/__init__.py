"""Models and data by name, in and out: what a config's model name means (models.py; the embedded
models, GGUFs inside installed packages converted once by gguf_cache.py: SmolLM2 in smollm2.py,
Gemma 3 270M in gemma3.py), any fine-tuned model to evaluate (finetuned.py) and the released agents it
knows (released.py), FireAct's released trajectories and runs (importers.py), and the cards our
checkpoints and datasets carry (cards.py). Nothing here loads an inference engine."""
