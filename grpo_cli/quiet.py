"""Library noise kept off the console: the libraries' info logs, per-step warnings and progress bars (errors stay
visible; GRPO_VERBOSE=1 shows everything). Light to import: call `quiet_libraries()` before torch, transformers and
trl are first imported, so that their import-time messages are silenced too."""

from __future__ import annotations

import logging
import os
import warnings
from contextlib import contextmanager

# Loggers of the libraries under the trainer, and the lowest level a person should still see from each.
NOISY_LOGGERS = {
    "transformers": logging.ERROR,
    "datasets": logging.ERROR,
    "accelerate": logging.ERROR,
    "peft": logging.WARNING,
    "trl": logging.WARNING,
    "bitsandbytes": logging.ERROR,  # "Failed to load CPU gemm_4bit_forward ..." at import, on every process
    "DeepSpeed": logging.ERROR,  # "Setting accelerator to CPU ..." at import
    "torch.distributed": logging.ERROR,
    # "Backend impl ... could not be imported" for each optional backend (CuTe DSL, Ascend) absent, on every process
    "liger_kernel": logging.ERROR,
}

# UserWarnings that libraries raise on every step or every process and that a person cannot act on.
NOISY_WARNINGS = (
    r"torch\.utils\.checkpoint: (the use_reentrant parameter|please pass in use_reentrant)",
    r"None of the inputs have requires_grad=True",
    r"You are importing from 'trl\.experimental'",
    r"MatMul8bitLt: inputs will be cast",
    r"TypedStorage is deprecated",
    r".*is deprecated and will be removed in",
    r"barrier\(\): using the device under current context",  # every accelerate wait_for_everyone, every process
)


class _Below(logging.Filter):
    """Drops records under a level, even after a library resets its logger's level (DeepSpeed does at import)."""

    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


_FILTERS: dict[str, _Below] = {}


def verbose() -> bool:
    """True when GRPO_VERBOSE asks to see every library message."""
    return os.environ.get("GRPO_VERBOSE", "").strip().lower() not in ("", "0", "false", "no")


def quiet_libraries() -> bool:
    """Keep library chatter (info logs, per-step warnings, progress bars) off the console; errors stay visible.

    Call it before importing torch/transformers/trl (it imports only their light logging modules).
    Does nothing with GRPO_VERBOSE=1.
    Returns whether it silenced.
    """
    if verbose():
        return False
    import datasets
    import huggingface_hub.utils as hub
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    # transformers' bars (loading and writing weights, at every checkpoint) would break the training bar;
    # the Hub's download bars stay.
    downloads_shown = not hub.are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()
    if downloads_shown:
        hub.enable_progress_bars()
    datasets.utils.logging.set_verbosity_error()
    if os.environ.get("HF_DATASETS_DISABLE_PROGRESS_BARS") is None:  # a person's explicit choice wins
        datasets.disable_progress_bars()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    for name, level in NOISY_LOGGERS.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.addFilter(_FILTERS.setdefault(name, _Below(level)))
    # FutureWarnings are addressed to the code calling the library (transformers, trl), not to a person training.
    warnings.filterwarnings("ignore", category=FutureWarning)
    for message in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
        warnings.filterwarnings("ignore", message=message, category=DeprecationWarning)
    return True



@contextmanager
def quiet_progress_bars():
    """Silence transformers' own tqdm bars (loading, saving) while a Rich display shows progress."""
    import transformers

    was_on = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            transformers.utils.logging.enable_progress_bar()
