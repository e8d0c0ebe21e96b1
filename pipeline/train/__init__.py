"""Everything that runs under `accelerate launch` (pipeline/finetune.py is the entry; script.py its
body): the config (config.py), the run resolved once into a plan (plan.py, launch.py), its steps in
order (run.py): the SFT data and tokenizer (data.py, sft.py: token ids and loss masks), the student
(model.py), the trainer (trainer.py; batching.py, flops.py, speed.py), checkpoints (checkpoints.py,
checks.py), DeepSpeed (deepspeed_setup.py), final/ (final.py) and the one-line failures
(failures.py); and the launching side the `train` and `grpo` stages share (launcher.py). Nothing
here imports an inference backend (tests/test_layout.py); pipeline/rl/ builds on it."""
