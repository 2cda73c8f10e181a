"""A reward that varies on random text, so a random-weight model gets non-zero advantages and its weights move."""


def vowel_share(completions, **kwargs):
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(1, len(t)) for t in texts]
