"""Text conventions shared by the backends: where a stop string ends a generation, and chat prompts."""

from __future__ import annotations

from collections.abc import Sequence


def find_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """The first stop string in `text` as (end offset, stop string), or None when there is none.

    "First" means the occurrence that ends earliest (the one a token-by-token check meets first); among
    occurrences ending at the same offset, the longest (e.g. ``</search>`` before ``search>``).
    """
    best: tuple[int, str] | None = None
    for stop in stops:
        start = text.find(stop)
        if start < 0:
            continue
        end = start + len(stop)
        if best is None or end < best[0] or (end == best[0] and len(stop) > len(best[1])):
            best = (end, stop)
    return best


def render_chat_prompt(tokenizer, user_message: str) -> str:
    """`user_message` rendered by the tokenizer's chat template as one user turn plus the generation prompt
    (so the text ends where the assistant's reply starts); the message itself without a template."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return user_message
    return tokenizer.apply_chat_template([{"role": "user", "content": user_message}], tokenize=False,
                                         add_generation_prompt=True)
