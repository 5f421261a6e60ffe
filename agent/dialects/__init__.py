"""Dialects: prompt, stop strings, parser and observation format per agent family (`base.Dialect`)."""

from __future__ import annotations

from .base import Action, ActionKind, Dialect, DocumentTracker, SelectedDocuments
from .qagent import QAgentDialect
from .reflect import ReflectDialect
from .s3 import S3Dialect
from .search_r1 import SearchR1Dialect

__all__ = ["DIALECTS", "Action", "ActionKind", "Dialect", "DocumentTracker", "QAgentDialect", "ReflectDialect",
           "S3Dialect", "SearchR1Dialect", "SelectedDocuments", "get_dialect"]

DIALECTS: dict[str, type[Dialect]] = {SearchR1Dialect.name: SearchR1Dialect, S3Dialect.name: S3Dialect,
                                      QAgentDialect.name: QAgentDialect, ReflectDialect.name: ReflectDialect}


def get_dialect(name: str) -> Dialect:
    """A fresh dialect by registry name (``search_r1``, ``s3``, ``qagent``, ``reflect``)."""
    try:
        return DIALECTS[name]()
    except KeyError:
        raise ValueError(f"unknown dialect {name!r}; choose one of {', '.join(sorted(DIALECTS))}") from None
