"""``loop.json``: the record of a co-training loop, one entry per (iteration, step).

Each entry holds the step's status (``running`` while it works, ``done`` once its artifact is complete), the
content hash of its inputs and settings (``key``), its artifact folder (relative to the loop folder), the wall
time of every attempt, and a summary the report reads. A step is skipped only when it is ``done`` with the key the
current config gives it and its artifact is still there; a ``running`` step (the run was killed in it) is run
again in the same folder, where the step's own resume continues it (rollouts, mining, RL checkpoints, retriever
checkpoints and index chunks all resume); a different key means new inputs or settings and a new versioned
folder, so nothing is overwritten in place. The finished versions a step had before are kept in ``history``: going
back to an earlier setting finds its finished artifact again instead of recomputing it.

Iteration 0 holds the loop's inputs (the data, the base index, the initial agent); iterations 1..K the six
steps of Algorithm 1 (`steps.STEPS`). The file is written atomically after every change.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_retriever.base.jsonl import write_json

__all__ = ["MANIFEST_FILE", "LoopManifest", "LoopManifestError", "StepRecord"]

MANIFEST_FILE = "loop.json"
FORMAT_VERSION = 1


class LoopManifestError(ValueError):
    """The loop folder's record cannot be used as it is; the message names the file and what to do."""


@dataclass
class StepRecord:
    """One (iteration, step) entry of ``loop.json``."""

    status: str                 # "running" or "done"
    key: str                    # content hash of the step's inputs and settings
    artifact: str               # relative to the loop folder (inputs kept elsewhere: ../...)
    identity: str = ""          # what downstream keys depend on: the key, or an input's content fingerprint
    seconds: float = 0.0        # wall time over all attempts
    attempts: int = 0
    started_at: str = ""
    finished_at: str = ""
    summary: dict | None = None

    @classmethod
    def from_dict(cls, data: dict, where: str) -> StepRecord:
        try:
            return cls(**data)
        except TypeError as error:
            raise LoopManifestError(f"{where}: {error}") from None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class LoopManifest:
    """The loop folder's ``loop.json``, read and written as a whole."""

    def __init__(self, folder: str | Path, corpus_sha256: str = "", config_file: str = ""):
        self.folder = Path(folder)
        self.path = self.folder / MANIFEST_FILE
        self.corpus_sha256 = corpus_sha256
        self.config_file = config_file
        self.created_at = _now()
        self.forced: dict[str, int] = {}
        self.steps: dict[str, StepRecord] = {}
        self.history: dict[str, dict[str, StepRecord]] = {}   # step name -> key -> an earlier finished version

    # ----------------------------------------------------------------------------------------------- reading
    @classmethod
    def load(cls, folder: str | Path) -> LoopManifest:
        """The record in `folder`; a missing file is an empty record, a corrupt one an error naming it."""
        manifest = cls(folder)
        if not manifest.path.exists():
            return manifest
        what_to_do = (f"restore it, or start the loop over in a new folder (loop.out); {manifest.folder} holds the "
                      "artifacts it indexes")
        try:
            data = json.loads(manifest.path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise LoopManifestError(f"{manifest.path} is not valid JSON (line {error.lineno}, column {error.colno}: "
                                    f"{error.msg}): {what_to_do}") from None
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION or not isinstance(data.get("steps"), dict):
            raise LoopManifestError(f"{manifest.path} is not a loop record of format version {FORMAT_VERSION} "
                                    f"(fields version, steps): {what_to_do}")
        manifest.corpus_sha256 = data.get("corpus_sha256", "")
        manifest.config_file = data.get("config_file", "")
        manifest.created_at = data.get("created_at", manifest.created_at)
        manifest.forced = dict(data.get("forced", {}))
        for name, entry in data["steps"].items():
            where = f"{manifest.path}: steps.{name}"
            if not isinstance(entry, dict) or entry.get("status") not in ("running", "done"):
                raise LoopManifestError(f"{where}: expected an entry with status 'running' or 'done': {what_to_do}")
            manifest.steps[name] = StepRecord.from_dict(entry, where)
        for name, versions in data.get("history", {}).items():
            manifest.history[name] = {key: StepRecord.from_dict(entry, f"{manifest.path}: history.{name}.{key}")
                                      for key, entry in versions.items()}
        return manifest

    @staticmethod
    def name(iteration: int, step: str) -> str:
        return f"{iteration}/{step}"

    def get(self, iteration: int, step: str) -> StepRecord | None:
        return self.steps.get(self.name(iteration, step))

    def artifact(self, record: StepRecord) -> Path:
        return self.folder / record.artifact

    def done(self, iteration: int, step: str, key: str) -> StepRecord | None:
        """The entry when the step is done with `key` (an earlier finished version with that key becomes current
        again); an error when the current entry says done but its artifact is gone."""
        record = self.get(iteration, step)
        if record is None or record.status != "done" or record.key != key:
            return self._restore(iteration, step, key)
        if not self.artifact(record).exists():
            raise LoopManifestError(
                f"{self.path}: step '{step}' of iteration {iteration} is recorded as done, but its artifact "
                f"{self.artifact(record)} is missing; rerun it with --from-iteration {iteration} --from-step {step}")
        return record

    def _restore(self, iteration: int, step: str, key: str) -> StepRecord | None:
        name = self.name(iteration, step)
        earlier = self.history.get(name, {}).get(key)
        if earlier is None or not self.artifact(earlier).exists():
            return None
        self._keep(name)
        self.steps[name] = self.history[name].pop(key)
        self.save()
        return earlier

    def _keep(self, name: str) -> None:
        """Move the current entry of `name` into the history when it is a finished version."""
        current = self.steps.get(name)
        if current is not None and current.status == "done":
            self.history.setdefault(name, {})[current.key] = current

    # ----------------------------------------------------------------------------------------------- writing
    def start(self, iteration: int, step: str, key: str, artifact: Path, identity: str = "") -> StepRecord:
        """Mark the step running (a rerun of a running step with the same key keeps its time and attempts; a
        finished version with another key goes into the history)."""
        previous = self.get(iteration, step)
        resumed = previous is not None and previous.status == "running" and previous.key == key
        self._keep(self.name(iteration, step))
        record = StepRecord(status="running", key=key, artifact=os.path.relpath(artifact, self.folder),
                            identity=identity or key, seconds=previous.seconds if resumed else 0.0,
                            attempts=(previous.attempts if resumed else 0) + 1, started_at=_now())
        self.steps[self.name(iteration, step)] = record
        self.save()
        return record

    def finish(self, iteration: int, step: str, seconds: float, summary: dict[str, Any],
               identity: str = "") -> StepRecord:
        record = self.steps[self.name(iteration, step)]
        record.status, record.finished_at, record.summary = "done", _now(), summary
        record.seconds = round(record.seconds + seconds, 1)
        if identity:
            record.identity = identity
        self.save()
        return record

    def add_time(self, iteration: int, step: str, seconds: float) -> None:
        """Count the time of an attempt that failed (it is part of the step's cost)."""
        record = self.steps[self.name(iteration, step)]
        record.seconds = round(record.seconds + seconds, 1)
        self.save()

    def force(self, iteration: int, step: str) -> None:
        """Make (iteration, step) and everything after it recompute (into new folders): its key changes."""
        name = self.name(iteration, step)
        self.forced[name] = self.forced.get(name, 0) + 1
        self.save()

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(self.path, {
            "version": FORMAT_VERSION, "corpus_sha256": self.corpus_sha256, "config_file": self.config_file,
            "created_at": self.created_at, "forced": self.forced,
            "steps": {name: vars(record) for name, record in self.steps.items()},
            "history": {name: {key: vars(r) for key, r in versions.items()} for name, versions in self.history.items()
                        if versions},
        })
