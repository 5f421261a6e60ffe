"""The manifest of an index folder: what built it, from what, and how to open it again.

`manifest.json` is written last, so its presence means the index is complete, and it is the commit point of a
build: it names the generation folder holding the build's data files (``data_dir``, `generations`), and replacing
it in one rename switches the index from one build's data to the next's. A manifest of an earlier version has no
``data_dir``: its data files are at the top of the index folder (`data_folder`).

Paths. The manifest names files outside the index folder: the corpus (``corpus_path``) and, for dense
indexes, the encoder (``encoder.config.model``, the folder or hub name to load; ``encoder.model``, the name
the settings were resolved from). A local path is stored relative to the index folder (``../../data/corpus.jsonl``),
so the index opens from any working directory and after its run folder (index, encoder and corpus together) is
moved or copied to another machine; ``build_paths`` keeps the absolute form each had at build time, tried next,
for an index folder moved alone on the same machine. Hub names and ``default`` are stored as they are.

`IndexManifest.load` resolves the paths: a loaded manifest holds absolute paths (what logs and ``GET /health``
report) and `save` writes them relative again. Manifests of earlier versions (``path_base`` absent: an absolute
corpus path, an encoder path as typed, relative to the folder the build ran in) are read too: a relative path is
tried against the index folder, then as given. A path found nowhere is kept as stored and listed in
`unresolved`; `require_path` turns it into an error naming the field, the paths tried and what to do. Paths are
only where to look: the corpus is checked by sha256 and the encoder by its fingerprint, so a moved folder
cannot silently open the wrong files.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from agentic_retriever.base.defaults import DEFAULT_ENCODER
from agentic_retriever.base.jsonl import read_json, write_json
from .. import __version__

MANIFEST_FILE = "manifest.json"
#: ``path_base`` of manifests whose relative paths are relative to the index folder.
PATH_BASE = "index"
#: The manifest's path fields, dotted: the corpus file, the encoder to load, the encoder's name in its settings.
PATH_FIELDS = ("corpus_path", "encoder.config.model", "encoder.model")
#: A Hugging Face hub id (``name`` or ``namespace/name``): kept as it is when no such local path exists.
_HUB_ID = re.compile(r"[A-Za-z0-9_][\w.-]*(/[\w.-]+)?")
#: The name of a generation folder (``data_dir``): this prefix and 32 hex digits, a folder inside the index folder.
DATA_DIR_PREFIX = "data-"
DATA_DIR_NAME = re.compile(DATA_DIR_PREFIX + "[0-9a-f]{32}")


class IndexMismatchError(ValueError):
    """An index opened with an encoder or corpus other than the ones it was built with."""


@dataclass
class IndexManifest:
    backend: str                      # dense | bm25 | pyserini
    index_type: str                   # flat | hnsw | ivfpq | bm25
    rows: int                         # passages in the index (the corpus minus any dropped empty passages)
    corpus_path: str
    corpus_sha256: str
    params: dict[str, Any] = field(default_factory=dict)
    encoder: dict[str, Any] | None = None   # EncoderSettings as a dict (dense only)
    dim: int | None = None
    build_seconds: float = 0.0
    created_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    library_version: str = __version__
    #: {"empty_text", "empty_title_and_text", "first_ids", "dropped"}: passages with empty (or whitespace) text
    #: at build time, those among them with an empty title too, the first few ids, and how many were left out
    #: of the index (`drop_empty`). None in manifests of earlier versions.
    empty_passages: dict[str, Any] | None = None
    #: "index": relative paths are relative to the index folder; None: a manifest of an earlier version.
    path_base: str | None = None
    #: Absolute form, at build time, of each local path field (dotted name -> path).
    build_paths: dict[str, str] = field(default_factory=dict)
    #: The generation folder, inside the index folder, holding this build's data files (`generations`); None in
    #: manifests of earlier versions, whose data files are at the top of the index folder.
    data_dir: str | None = None

    #: Path fields found nowhere when the manifest was loaded: dotted name -> the absolute paths tried.
    unresolved: ClassVar[dict[str, list[str]]] = {}   # replaced per instance by `load`

    @property
    def composition(self) -> str:
        return (self.encoder or {}).get("composition", "query")

    @property
    def dropped(self) -> int:
        """Empty passages left out of the index (their rows are not searched)."""
        return int((self.empty_passages or {}).get("dropped", 0))

    def save(self, index_dir: str | Path) -> None:
        """Write the manifest, local paths relative to `index_dir` (this object keeps them absolute)."""
        base = os.path.abspath(index_dir)
        local = []
        for key in PATH_FIELDS:
            value = _get(self, key)
            if not isinstance(value, str) or key in self.unresolved:
                continue  # a path found nowhere stays as it was stored, with its build path
            if key == "corpus_path" or (value != DEFAULT_ENCODER and os.path.exists(value)):
                absolute = os.path.abspath(value)
                _set(self, key, absolute)
                self.build_paths[key] = absolute
                local.append(key)
            else:
                self.build_paths.pop(key, None)  # a hub name
        self.path_base = PATH_BASE
        data = dataclasses.asdict(self)
        for key in local:
            _set(data, key, _relative(_get(self, key), base))
        write_json(Path(index_dir) / MANIFEST_FILE, data)

    @classmethod
    def load(cls, index_dir: str | Path) -> IndexManifest:
        path = Path(index_dir) / MANIFEST_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{index_dir} is not a complete index: {MANIFEST_FILE} is missing "
                                    "(build it with `agentic-retriever index build`; an interrupted build resumes)")
        data = read_json(path)
        data_dir = data.get("data_dir")
        if data_dir is not None and not (isinstance(data_dir, str) and DATA_DIR_NAME.fullmatch(data_dir)):
            raise ValueError(f"{path}: field 'data_dir' is {data_dir!r}, not the name of a generation folder "
                             f"({DATA_DIR_PREFIX}<32 hex digits>, inside the index folder); rebuild the index with "
                             f"`agentic-retriever index build`")
        known = {f.name for f in dataclasses.fields(cls)}
        manifest = cls(**{k: v for k, v in data.items() if k in known})
        manifest._resolve_paths(Path(index_dir))
        return manifest

    def data_folder(self, index_dir: str | Path) -> Path:
        """The folder holding this index's data files: its generation folder inside `index_dir`, or `index_dir`
        itself for an index of an earlier version (no ``data_dir``). A generation folder that is gone (removed by
        a later build of this folder after this manifest was read) is a FileNotFoundError naming it."""
        if self.data_dir is None:
            return Path(index_dir)
        folder = Path(index_dir) / self.data_dir
        if not folder.is_dir():
            raise FileNotFoundError(
                f"index {index_dir}: {MANIFEST_FILE} names the data folder {self.data_dir!r} (field 'data_dir'), and "
                f"it is not there: a later build of this folder replaced it since the manifest was read (open the "
                f"index again), or it was deleted (rebuild the index with `agentic-retriever index build`)")
        return folder

    def set_path(self, key: str, value: str) -> None:
        """Point a path field (dotted name) at `value`, a local path (as given) or a hub name."""
        _set(self, key, value)
        self.unresolved = {k: v for k, v in self.unresolved.items() if k != key}

    def require_path(self, key: str, index_dir: str | Path, remedy: str) -> str:
        """The resolved path of field `key`, or FileNotFoundError naming the field, the paths tried and `remedy`."""
        if key not in self.unresolved:
            return _get(self, key)
        tried = self.unresolved[key]
        era = ("relative paths are relative to the index folder" if self.path_base == PATH_BASE else
               "written by an earlier version: a relative path there is relative to the folder the build ran in")
        raise FileNotFoundError(
            f"index {index_dir}: manifest field {key!r} is {_get(self, key)!r} ({era}), and nothing is at "
            f"{' nor at '.join(tried)}. {remedy}"
        )

    def _resolve_paths(self, index_dir: Path) -> None:
        base = os.path.abspath(index_dir)
        self.unresolved = {}
        current = self.path_base == PATH_BASE
        for key in PATH_FIELDS:
            raw = _get(self, key)
            if not isinstance(raw, str) or (key != "corpus_path" and raw == DEFAULT_ENCODER):
                continue
            hub_like = key != "corpus_path" and _HUB_ID.fullmatch(raw) is not None
            if current and hub_like and key not in self.build_paths:
                continue  # stored as a hub name (local paths are stored as ./x, ../x or absolute)
            tried = [os.path.normpath(os.path.join(base, raw))]  # an absolute raw stays itself
            if key in self.build_paths:
                tried.append(self.build_paths[key])
            if not current and not os.path.isabs(raw):
                tried.append(os.path.abspath(raw))  # an earlier version's path as typed, relative to the cwd
            tried = list(dict.fromkeys(tried))
            found = next((p for p in tried if os.path.exists(p)), None)
            if found is not None:
                _set(self, key, found)
            elif not hub_like:
                self.unresolved[key] = tried
            # else: an earlier version's hub name (or a path that looks like one), loaded as it is

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


def _relative(path: str, base: str) -> str:
    """`path` relative to `base` as a POSIX path starting with ``./`` or ``../`` (absolute across drives)."""
    try:
        relative = Path(os.path.relpath(path, base)).as_posix()
    except ValueError:  # another drive (Windows)
        return path
    return relative if relative.startswith("../") or relative == ".." else f"./{relative}"


def _get(obj, dotted: str):
    head, _, rest = dotted.partition(".")
    value = obj.get(head) if isinstance(obj, dict) else getattr(obj, head)
    if not rest:
        return value
    return _get(value, rest) if isinstance(value, dict) else None


def _set(obj, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for name in parents:
        obj = obj[name] if isinstance(obj, dict) else getattr(obj, name)
    if isinstance(obj, dict):
        obj[last] = value
    else:
        setattr(obj, last, value)
