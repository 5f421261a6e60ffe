"""What every reward reads: the response, given as text or as an object that carries it.

A reward scores the response only (the prompt excluded), as verl's reward managers decode it
(scoring the response alone removes the prompt quirk of Search-R1's release; docs/paper-deviations.md,
"Search-R1 and the empirical study").
`agent.trajectory.Trajectory` and `agent.env.Rollout` both carry it as ``response_text``: a reward of a
trajectory equals the reward of its ``response_text``.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["HasResponseText", "Response", "response_text"]


class HasResponseText(Protocol):
    """Anything with the response (generated text and inserted observations, prompt excluded) as text."""

    @property
    def response_text(self) -> str: ...


Response = str | HasResponseText


def response_text(response: Response) -> str:
    """The response as text: a string as is, else the object's ``response_text``."""
    if isinstance(response, str):
        return response
    text = getattr(response, "response_text", None)
    if not isinstance(text, str):
        raise TypeError(f"a reward takes the response as a string or an object with a string `response_text` "
                        f"(Trajectory, Rollout), got {type(response).__name__}")
    return text
