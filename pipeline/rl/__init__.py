"""Reinforcement learning in the environment: GRPO of a student, its rollouts in the project's
own ReAct / Act loop (`python -m pipeline grpo`; docs/grpo.md).

    config.py     the stage's config (GrpoConfig)            start.py   where the policy starts
    plan.py       the run resolved once (RlPlan)              (its model card: pipeline.hub.cards)
    train.py      the script `accelerate launch` runs         rollout.py TRL's rollout_func: episodes
    trace.py      one rollout's tokens and env mask           policy.py  the policy as a token generator
    reward.py     the reward from the task's metric           throughput.py  FLOPs and MFU per step
    curve.py      the reward curve (CSV, PNG)
"""
