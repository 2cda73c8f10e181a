"""Training: `grpo sft` (SFTTrainer) and `grpo rl` (GRPOTrainer), with checkpoints, console and tracking."""
