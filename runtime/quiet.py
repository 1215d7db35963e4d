"""The third-party warnings and log lines growlm hides, all in this one place (DESIGN.md, "Known third-party noise").

Each entry is a message that growlm cannot fix at its cause because it comes from a library's own call, and that
says nothing a growlm user can act on. Everything else a library warns about is shown. ``quiet_known_noise`` is
called by ``runtime.dist.select_accelerator``, which every process that uses DeepSpeed runs before importing it.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

# (category, message regex, who emits it and why it is harmless)
KNOWN_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    (
        FutureWarning,
        r"`torch\.distributed\.all_gather_into_tensor` is deprecated",
        "DeepSpeed 0.19's ZeRO all-gathers call the name torch 2.13 renamed to all_gather_single (same collective)",
    ),
    (
        FutureWarning,
        r"`torch\.distributed\.reduce_scatter_tensor` is deprecated",
        "DeepSpeed 0.19's ZeRO reduce-scatters call the name torch 2.13 renamed (same collective)",
    ),
)


class _DropMessages(logging.Filter):
    """A logging filter that drops records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)


# DeepSpeed logger records growlm hides: (message prefix, why)
KNOWN_LOG_LINES: tuple[tuple[str, str], ...] = (
    (
        "Attempting to get learning rate from scheduler before it has started",
        "DeepSpeed 0.19's WarmupCosineLR constructor asks its own get_lr at last_batch_iteration -1 (LR 0); growlm's "
        "start_schedule then moves every fresh schedule to its first iteration",
    ),
)


def quiet_known_noise() -> None:
    """Install the filters for ``KNOWN_WARNINGS`` and ``KNOWN_LOG_LINES`` (idempotent)."""
    for category, message, _why in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    if KNOWN_LOG_LINES:
        logger = logging.getLogger("DeepSpeed")
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(tuple(p for p, _ in KNOWN_LOG_LINES)))


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' warnings and progress bars off for the block (the rope-parameter check of a config growlm then
    refuses in its own one line, save_pretrained's "Writing model shards" bar: growlm says what it wrote), both
    restored after."""
    from transformers.utils import logging as hf_logging  # lazy: heavy (about 2 s), only for a transformers folder

    before, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)
        if bars:
            hf_logging.enable_progress_bar()
