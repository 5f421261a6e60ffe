"""The manifest of an index folder: what built it, from what, and how to open it again.

`manifest.json` is written last, so its presence means the index is complete.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..jsonl import read_json, write_json

MANIFEST_FILE = "manifest.json"


class IndexMismatchError(ValueError):
    """An index opened with an encoder or corpus other than the ones it was built with."""


@dataclass
class IndexManifest:
    backend: str                      # dense | bm25 | pyserini
    index_type: str                   # flat | hnsw | ivfpq | bm25
    rows: int
    corpus_path: str
    corpus_sha256: str
    params: dict[str, Any] = field(default_factory=dict)
    encoder: dict[str, Any] | None = None   # EncoderSettings as a dict (dense only)
    dim: int | None = None
    build_seconds: float = 0.0
    created_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    library_version: str = __version__

    @property
    def composition(self) -> str:
        return (self.encoder or {}).get("composition", "query")

    def save(self, index_dir: str | Path) -> None:
        write_json(Path(index_dir) / MANIFEST_FILE, dataclasses.asdict(self))

    @classmethod
    def load(cls, index_dir: str | Path) -> IndexManifest:
        path = Path(index_dir) / MANIFEST_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{index_dir} is not a complete index: {MANIFEST_FILE} is missing "
                                    "(build it with `agentic-retriever index build`; an interrupted build resumes)")
        data = read_json(path)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def check_encoder(self, fingerprint: str, model: str) -> None:
        """Refuse to search with an encoder whose weights or conventions differ from the build's."""
        built = self.encoder or {}
        if built.get("fingerprint") != fingerprint:
            raise IndexMismatchError(
                f"the index was built with encoder {built.get('model')!r} (fingerprint {built.get('fingerprint')}), "
                f"not with {model!r} (fingerprint {fingerprint}): its vectors would be meaningless for these queries; "
                "rebuild the index with this encoder or open it without overriding the encoder"
            )

    def check_corpus(self, corpus_sha256: str, path: str) -> None:
        if corpus_sha256 != self.corpus_sha256:
            raise IndexMismatchError(
                f"corpus {path} (sha256 {corpus_sha256[:12]}) is not the corpus this index was built from "
                f"({self.corpus_path}, sha256 {self.corpus_sha256[:12]})"
            )
