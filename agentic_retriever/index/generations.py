"""The data files of an index folder, one generation folder per build, and the atomic switch from one to the next.

An index folder holds ``manifest.json`` and the data files of the build it describes: ``index.faiss`` (dense),
``bm25/`` or ``lucene/`` (sparse), and ``rows.npy`` when passages were left out. Each build writes its data files
into a generation folder of its own, ``data-<32 hex digits>`` inside the index folder, and its manifest names that
folder (``data_dir``). The manifest is the single commit point: a build fills its generation completely, then
replaces ``manifest.json`` with one rename (`IndexManifest.save` writes a uniquely named temp file and
``os.replace``s it), and only then removes the data the manifest named before. So whatever a kill interrupts, and
however two builds into one folder interleave, the manifest on disk names the complete generation its own build
wrote: no reader pairs a manifest with another build's data files (of two concurrent builds, the last commit wins).

A folder written by an earlier version (a manifest without ``data_dir``, its data files at the top level) opens as
before (`IndexManifest.data_folder`); the first build over it removes those top-level files after its commit.

A build holds an exclusive lock (``flock``) on its generation folder until it has committed or failed; one that
fails with an exception removes its folder. After committing, a build removes every generation folder that the
manifest does not name and no build holds: the one it replaced, and those left by a build killed outright or by
the loser of two builds that committed at the same time. A build that finds its index already complete removes them
too, so a kill between a commit and its removal leaves nothing for good.

    with NewGeneration(index_dir) as generation:
        faiss.write_index(index, str(generation.path / FAISS_FILE))
        generation.commit(manifest)
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import uuid
from pathlib import Path

from .manifest import DATA_DIR_NAME, DATA_DIR_PREFIX, IndexManifest

log = logging.getLogger(__name__)

#: A dense index's FAISS file.
FAISS_FILE = "index.faiss"
#: Corpus row of each index position, in an index that left passages out (`IndexManifest.dropped`).
ROW_MAP_FILE = "rows.npy"
#: A bm25s index's folder, and a pyserini index's Lucene folder with the collection it was built from.
BM25_DIR = "bm25"
LUCENE_DIR = "lucene"
LUCENE_COLLECTION_DIR = "lucene_collection"
#: Where earlier versions wrote the data files: the top of the index folder (and a fixed-name FAISS temp file).
LEGACY_DATA = (FAISS_FILE, f".{FAISS_FILE}.tmp", ROW_MAP_FILE, BM25_DIR, LUCENE_DIR, LUCENE_COLLECTION_DIR)


class NewGeneration:
    """One build's generation folder (`path`): created empty and locked on entry; `commit` makes it the index;
    on exit the lock is released, and the folder is removed when the build did not commit."""

    def __init__(self, index_dir: str | Path):
        self.index_dir = Path(index_dir)
        self.path: Path | None = None
        self._lock: int | None = None
        self._committed = False

    def __enter__(self) -> NewGeneration:
        self.index_dir.mkdir(parents=True, exist_ok=True)
        self.path, self._lock = _create_locked(self.index_dir)
        return self

    def commit(self, manifest: IndexManifest) -> None:
        """Point `manifest` at this generation and write it over the index folder's manifest (the switch), then
        remove the data files no manifest names any more."""
        manifest.data_dir = self.path.name
        manifest.save(self.index_dir)
        self._committed = True
        log.info("index %s now opens its data files from %s", self.index_dir, self.path.name)
        remove_superseded(self.index_dir, keep=self.path.name)

    def __exit__(self, *exc) -> None:
        if not self._committed:
            _remove(self.path)
        os.close(self._lock)


def _create_locked(index_dir: Path) -> tuple[Path, int]:
    """A new, empty generation folder and the descriptor holding its lock. It is made under a hidden name, locked,
    then renamed, so no other build ever sees it unlocked before this one is done with it."""
    name = f"{DATA_DIR_PREFIX}{uuid.uuid4().hex}"
    staging = index_dir / f".{name}.tmp"
    staging.mkdir()
    lock = os.open(staging, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.rename(staging, index_dir / name)
    except BaseException:
        os.close(lock)
        staging.rmdir()
        raise
    return index_dir / name, lock


def remove_superseded(index_dir: Path, keep: str) -> None:
    """Remove what the index folder's manifest no longer names: the top-level data files of an earlier version,
    and the generation folders other than `keep` that no build holds. Nothing is removed when the manifest names
    no generation (an earlier version's build committed last). A build calls it after its commit, and a build that
    finds its index complete calls it too (with the generation the manifest names): a build killed between its
    commit and this removal left the generation it replaced."""
    named = IndexManifest.load(index_dir).data_dir
    if named is None:
        return
    for name in LEGACY_DATA:
        _remove(index_dir / name)
    for folder in index_dir.iterdir():
        if folder.name not in (keep, named) and DATA_DIR_NAME.fullmatch(folder.name):
            _remove_unless_held(folder, index_dir)


def _remove_unless_held(folder: Path, index_dir: Path) -> None:
    """Remove a generation folder unless a build holds it, or the manifest names it (a build commits before it
    lets go of its folder, so one that let go since the manifest was read has committed it, and a fresh read says
    so)."""
    try:
        lock = os.open(folder, os.O_RDONLY)
    except FileNotFoundError:
        return  # removed by a concurrent build
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a build is writing it
        if IndexManifest.load(index_dir).data_dir != folder.name:
            _remove(folder)
    finally:
        os.close(lock)


def _remove(path: Path) -> None:
    """Remove a data file or folder that no manifest names; a failure is logged (the index stays correct)."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass  # not there, or removed by a concurrent build first
    except OSError as error:
        log.warning("could not remove %s, which no index manifest names any more (%s); remove it by hand", path,
                    error)

