"""Rewards for the benchmarks' training runs: one that varies on random text, so a random-weight model gets non-zero
advantages and its weights move, and one a pretrained model learns within a few steps."""


def vowel_share(completions, **kwargs):
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(1, len(t)) for t in texts]


def digit_share(completions, **kwargs):
    """The share of digits in a completion: a pretrained model learns it within a few steps (SmolLM2-135M-Instruct,
    lr 1e-4, 4 prompts x 8 completions of 48 tokens a step, on the CPU: 0.07 at step 1, 0.62 at step 5, 1.0 at 10)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]
