"""The recipe keys grpo adds to TRL's `ModelConfig`, `GRPOConfig` and `SFTConfig`: data types at the bottom of the
package (they import nothing of grpo's), so tasks and rewards can take them without importing the recipe loader, and
`grpo check` can read their fields without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class TaskArguments:
    """Which task turns dataset rows into prompts, and where its rows come from."""

    task: str = field(
        default="countdown",
        metadata={"help": "Registered task that builds prompts and knows the answer columns (see `grpo tasks`)."},
    )
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Hub dataset id, or a local .jsonl/.json/.parquet file or folder. Default: the task's own dataset."
        },
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Dataset configuration name on the Hub."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split used for training."})
    dataset_test_split: str = field(default="test", metadata={"help": "Split used by `grpo eval`."})
    dataset_test_size: float = field(
        default=0.0,
        metadata={
            "help": "When the dataset has no test split, hold out this many rows (>= 1) or this share (< 1) of the "
            "train split as the test split, with `dataset_seed`. Training never sees them."
        },
    )
    dataset_generate: int = field(
        default=0,
        metadata={
            "help": "Generate this many rows with the task's own generator (countdown; reasoning-gym's for reasoning_gym, "
            "gsm8k and dapo_math) instead of loading data; 0 loads dataset_name (a recipe that generates its rows "
            "refuses a --dataset_name without --dataset_generate 0)."
        },
    )
    dataset_generate_name: str | None = field(
        default=None,
        metadata={
            "help": "reasoning_gym, gsm8k and dapo_math, with dataset_generate: the reasoning-gym dataset to generate, "
            "e.g. gsm_symbolic (gsm8k's default) or coin_flip (`grpo data reasoning_gym` lists them)."
        },
    )
    dataset_generate_config: dict = field(
        default_factory=dict,
        metadata={
            "help": "reasoning_gym, gsm8k and dapo_math, with dataset_generate: the dataset's config keys, e.g. "
            "{min_terms: 2, max_terms: 3} for chain_sum. Default: reasoning-gym's."
        },
    )
    dataset_generate_numbers: list[int] = field(
        default_factory=lambda: [3, 4],
        metadata={
            "help": "Countdown, with dataset_generate: the fewest and the most numbers in a generated problem, e.g. "
            "[3, 3] for problems a small model can solve."
        },
    )
    dataset_seed: int = field(default=0, metadata={"help": "Seed for generated data and for the held-out test split."})
    max_samples: int | None = field(default=None, metadata={"help": "Use at most this many training rows."})
    system_prompt: str | None = field(
        default=None, metadata={"help": "System message for every prompt. Default: the task's own; '' for none."}
    )
    prompt_column: str | None = field(
        default=None, metadata={"help": "Use this dataset column as the user message, as it is."}
    )
    prompt_template: str | None = field(
        default=None,
        metadata={"help": "User message as a Python format string over the row's columns, e.g. 'Solve: {question}'."},
    )
    prefill: str | None = field(
        default=None,
        metadata={"help": "Text the assistant turn starts with (rewards score it with the completion: their `prefill` keyword). Default: the task's; '' for none."},
    )
    chat_template: str | None = field(
        default=None,
        metadata={"help": "Chat template (Jinja text or a path to a .jinja file) for models without one."},
    )


@dataclass
class HubArguments:
    """Where the Hub ids of `model_name_or_path` and `dataset_name` are downloaded from."""

    model_source: Literal["huggingface", "modelscope"] = field(
        default="huggingface",
        metadata={
            "help": "Hub of model and dataset ids: huggingface, or modelscope (needs `pip install "
            "'grpo-cli[modelscope]'`; its cache is MODELSCOPE_CACHE). Unset: GRPO_MODEL_SOURCE, else huggingface."
        },
    )


@dataclass
class RewardArguments:
    """Which rewards score completions (weights are GRPOConfig's `reward_weights`)."""

    reward_funcs: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Registered reward names, or 'package.module:function' / 'path/file.py:function'. "
            "Default: the task's rewards (see `grpo rewards list`)."
        },
    )
    reward_timeout: float = field(
        default=0.5,
        metadata={
            "help": "Seconds per completion one reward may spend on a batch before the batch gets the failure value."
        },
    )
    overlong_buffer: int | None = field(
        default=None,
        metadata={
            "help": "The `overlong_penalty` reward's ramp: 0 up to max_completion_length minus this many tokens, "
            "falling to -1 at the limit. Default: a fifth of max_completion_length."
        },
    )


@dataclass
class TrackingArguments:
    """Experiment tracking (SwanLab) and what the console shows during a run."""

    swanlab: bool = field(default=False, metadata={"help": "Log the run to SwanLab."})
    swanlab_project: str = field(default="grpo", metadata={"help": "SwanLab project name."})
    swanlab_experiment: str | None = field(
        default=None, metadata={"help": "SwanLab experiment name. Default: the run name or the output folder's name."}
    )
    swanlab_workspace: str | None = field(default=None, metadata={"help": "SwanLab workspace (organisation)."})
    swanlab_mode: Literal["cloud", "local", "offline", "disabled"] = field(
        default="cloud",
        metadata={"help": "cloud needs an API key; local and offline write files only; disabled logs nothing."},
    )
    swanlab_logdir: str | None = field(
        default=None, metadata={"help": "Folder for SwanLab's files. Default: OUTPUT_DIR/swanlog."}
    )
    sample_every: int = field(
        default=10, metadata={"help": "Show a few sample completions with their rewards every N steps (0: never)."}
    )
    sample_count: int = field(default=2, metadata={"help": "How many sample completions to show each time."})


@dataclass
class MemoryArguments:
    """How `grpo rl` trades speed for GPU memory beyond what GRPOConfig offers (`grpo sft` has SFTConfig's own)."""

    activation_offloading: bool = field(
        default=False,
        metadata={
            "help": "Keep each checkpointed decoder layer's input in CPU memory between a micro-batch's forward and "
            "backward passes (CUDA; needs gradient_checkpointing): less GPU memory, slightly longer steps. Unset: "
            "on where a micro-batch's layer inputs are at least half the rollout's KV cache (all of it with LoRA)."
        },
    )
    lean_lm_head: bool = field(
        default=False,
        metadata={
            "help": "Sum the LM head's weight gradient one vocabulary chunk at a time, instead of in one float32 "
            "tensor the size of the head: the same gradients in less GPU memory, slightly longer steps. Unset: "
            "on where `activation_offloading` is on by default, unless LoRA leaves the head untrained."
        },
    )


@dataclass
class KernelArguments:
    """Kernels grpo runs in the forward/backward pass in place of the libraries' own."""

    fused_lora: bool = field(
        default=False,
        metadata={
            "help": "Compute each LoRA layer's forward and backward in the base weights' dtype in a few fused "
            "products (grpo_cli/engine/lora.py) instead of PEFT's forward, which casts every activation to float32 "
            "and back. On by default for `grpo rl` with LoRA on a GPU, without DeepSpeed, FSDP or k-bit weights."
        },
    )
    flash_attention: bool = field(
        default=False,
        metadata={
            "help": "Run the forward/backward's attention over a padded batch through PyTorch's FlashAttention "
            "kernel for sequences of several lengths (grpo_cli/engine/attention.py), not SDPA's slower padding-mask "
            "kernel. Needs a CUDA GPU; other calls go to SDPA. On by default for `grpo rl` on a GPU."
        },
    )
    packed_forward: bool = field(
        default=False,
        metadata={
            "help": "`grpo rl`: train each micro-batch without its padding, each prompt once for the completions "
            "that share it (grpo_cli/engine/packed.py); the same logits and gradients. On by default on a GPU without "
            "DeepSpeed or FSDP where `grpo check`'s estimate says it shortens the step (large models)."
        },
    )


@dataclass
class HealthArguments:
    """What a run does with non-finite numbers (NaN, inf) in a step, and with a step that never ends; the attention
    kernel known to make them; and the updates that bfloat16 weights would round away."""

    nonfinite_guard: bool = field(
        default=True,
        metadata={
            "help": "Check every step's rewards, advantages, losses and gradients: a step with a non-finite one "
            "applies no update and is named on the console; weights are checked before every save."
        },
    )
    nonfinite_patience: int = field(
        default=3,
        metadata={
            "help": "Stop the run (exit code 2) after this many non-finite steps in a row, naming the last healthy "
            "checkpoint; 0: skip them and go on."
        },
    )
    cudnn_attention: bool = field(
        default=False,
        metadata={
            "help": "Let torch's scaled_dot_product_attention use its cuDNN kernels in training. Off: with a padding "
            "mask their backward returns NaN query gradients at sequence lengths of 64 modulo 128 (H100/H200, "
            "torch 2.11 and later; pytorch issue 196678); the memory-efficient kernel runs instead."
        },
    )
    stall_timeout: float = field(
        default=1800,
        metadata={
            "help": "When no step ends for this many seconds, write every thread's Python stack to "
            "OUTPUT_DIR/stall-stacks.txt and say so (the run goes on waiting); 0: never."
        },
    )
    master_weights: bool = field(
        default=False,
        metadata={
            "help": "Keep float32 copies of weights that train in bfloat16 and let the optimizer update those: "
            "rounding to bfloat16 loses nearly every AdamW update at GRPO's learning rates. Costs 8 bytes a "
            "parameter. Unset: on for full fine-tuning of a bfloat16 model without DeepSpeed (which keeps its own)."
        },
    )
    master_weights_rounding: Literal["nearest", "stochastic"] = field(
        default="stochastic",
        metadata={
            "help": "How master weights are rounded into the bfloat16 weights after a step: stochastic (up or down, "
            "the copy's value on average: small updates show from the first step) or nearest (a weight moves once "
            "its copy has moved half a bfloat16 unit, as under bfloat16 autocast)."
        },
    )


@dataclass
class SamplingArguments:
    """Which generated groups (the completions of one prompt) `grpo rl` trains on, and in which micro-batches."""

    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "Drop every group whose completions all got the same reward (no advantage, no gradient) and fill "
            "the batch with groups of fresh prompts, generated in extra rounds (DAPO's dynamic sampling). Works on "
            "each generation batch, so with any `steps_per_generation` and `num_iterations`."
        },
    )
    dynamic_sampling_max_rounds: int = field(
        default=3,
        metadata={
            "help": "At most this many extra generation rounds per generation batch; a batch still short is filled "
            "with dropped groups (said once on the console)."
        },
    )
    skip_zero_advantage: bool = field(
        default=True,
        metadata={
            "help": "Leave completions whose advantage is zero (their prompt's completions all scored alike) out of "
            "the forward/backward, the others regrouped into as few micro-batches as they fill, the loss scaled to the "
            "same update. Off where beta, an entropy bonus or top_entropy_quantile give them a gradient."
        },
    )
    pack_micro_batches: bool = field(
        default=True,
        metadata={
            "help": "Fill a step's micro-batches, longest completions first, with as many as fit the tokens of "
            "per_device_train_batch_size completions at the step's longest, so short completions take fewer "
            "micro-batches; the emptied ones run no forward/backward. One process and DDP."
        },
    )


@dataclass
class RolloutArguments:
    """What samples `grpo rl`'s completions."""

    rollout_engine: Literal["grpo", "trl"] = field(
        default="trl",
        metadata={
            "help": "grpo: grpo's sampler (a static KV cache, CUDA-graph decode steps on a GPU; under DeepSpeed "
            "ZeRO-3 the weights gathered once per generation batch), or TRL's generate where a set-up needs it "
            "(vLLM, FSDP, tools, images), said once; trl: TRL's generate. Unset: grpo on a GPU, trl on the CPU."
        },
    )


OWN_ARGUMENTS = {
    "task": TaskArguments,
    "hub": HubArguments,
    "reward": RewardArguments,
    "tracking": TrackingArguments,
    "memory": MemoryArguments,
    "kernels": KernelArguments,
    "health": HealthArguments,
    "sampling": SamplingArguments,
    "rollout": RolloutArguments,
}
