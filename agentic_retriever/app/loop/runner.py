"""`run_loop`: Algorithm 1 of "Agentic-R: Learning to Retrieve for Agentic Search" (arXiv 2601.11888, section 4.2)
as one resumable job.

Iteration 0 settles the loop's inputs: the data (``data_prepare``; then `splits.check_splits` refuses a training
question set that meets the selection slice or a dev set), the base index Agentic-R_0 (built when
missing, reused when present) and the initial agent (the warm start of ``agent_sft``, reused from its cache, or the
shared ``agent.model``). Then, for i = 1..K, the six steps of `steps.ITERATION`, each keyed by the content hash of its
inputs and settings (`manifest`): a step runs when no finished entry has its key, so a changed mining setting reruns
mining, retriever training, indexing and evaluation of that iteration and everything of the later ones, and nothing
before. A retrieval service (`service`) runs through the whole loop and is moved onto each new index; the servers
of ``loop.step_servers`` (`processes.StepServers`) run only while the steps that name them run.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

from agentic_retriever.base.fingerprint import stable_hash
from agentic_retriever.base.memory_release import release_freed_memory
from agentic_retriever.base.writer_lock import WriterLock
from .config import LoopJob
from .manifest import LoopManifest, LoopManifestError, StepRecord
from .placement import connect_cluster
from .processes import StepServers, step_server_specs, signals_stop_children
from .report import write_report
from .service import LoopService
from .splits import check_splits
from .steps import ITERATION, STEPS, Iteration, changed_settings

__all__ = ["LOCK_FILE", "run_loop"]

#: The loop folder's writer lock (`agentic_retriever.base.writer_lock`), held by the one run writing the folder.
LOCK_FILE = "loop.lock"

log = logging.getLogger(__name__)


class _Loop:
    """One run of the loop over its manifest: runs or skips each step, one status line each."""

    def __init__(self, job: LoopJob):
        self.job = job
        self.folder = Path(job.loop.out)
        self.manifest = LoopManifest.load(self.folder)
        self.step_servers: StepServers | None = None
        if not self.manifest.config_file:
            self.manifest.config_file = job.config_file

    # ------------------------------------------------------------------------------------------------- plumbing
    def step(self, iteration: int, name: str, parts: dict, run: Callable[[Path], dict], artifact: Path | None = None,
             identity: Callable[[dict], str] | None = None) -> StepRecord:
        """Run (iteration, name) unless it is done with the key of `parts`; `run` gets the artifact folder (a new
        versioned one under ``iter_i/name/`` unless the step's artifact is an input kept elsewhere)."""
        key = stable_hash({"step": name, "forced": self.manifest.forced.get(self.manifest.name(iteration, name), 0),
                           **parts})
        label = f"[iteration {iteration}/{self.job.loop.iterations}] {name}" if iteration else f"[inputs] {name}"
        record = self.manifest.done(iteration, name, key)
        if record is not None:
            print(f"{label}: done earlier in {record.seconds:.0f} s ({self.manifest.artifact(record)})", flush=True)
            return record
        folder = artifact or self.folder / f"iter_{iteration}" / name / key[:12]
        record = self.manifest.start(iteration, name, key, folder)
        print(f"{label}: {'resuming' if record.attempts > 1 else 'running'} -> {folder}", flush=True)
        if self.step_servers is not None:
            self.step_servers.before(name)
        started = time.perf_counter()
        try:
            summary = self._run_reviving(name, run, folder)
        except BaseException:
            self.manifest.add_time(iteration, name, time.perf_counter() - started)
            raise
        finally:
            release_freed_memory()  # what the step freed, back to the system before the next step allocates
        record = self.manifest.finish(iteration, name, time.perf_counter() - started, summary,
                                      identity(summary) if identity else "")
        print(f"{label}: done in {record.seconds:.0f} s", flush=True)
        return record

    def _run_reviving(self, name: str, run: Callable[[Path], dict], folder: Path) -> dict:
        """`run(folder)`; when it fails and a server of the step had died (`StepServers.revive` started it again),
        once more, continuing from what the step stored (a scorer's replies, finished rounds, checkpoints)."""
        while True:
            try:
                return run(folder)
            except Exception as error:
                if self.step_servers is None or not self.step_servers.revive(name):
                    raise
                print(f"{name} failed while its server was down ({type(error).__name__}: {error}); running it again "
                      "from what it stored", flush=True)

    def record(self, iteration: int, name: str) -> StepRecord:
        record = self.manifest.get(iteration, name)
        if record is None or record.status != "done":
            raise LoopManifestError(f"{self.manifest.path}: step '{name}' of iteration {iteration} is not done")
        return record

    # ------------------------------------------------------------------------------------------------- iteration 0
    def inputs(self) -> None:
        from agentic_retriever.base.corpus import Corpus
        from agentic_retriever.base.fingerprint import model_fingerprint
        from agentic_retriever.index import build_index
        from agentic_retriever.index.identity import index_identity
        from agentic_retriever.index.manifest import IndexManifest

        job = self.job
        if job.prepare is not None:
            from agentic_retriever.base.data.prepare import prepare_defaults

            self.step(0, "data", {"prepare": changed_settings(job.prepare)}, lambda _: prepare_defaults(job.prepare),
                      artifact=Path(job.prepare.out))
        check_splits(job)  # the data is there: nothing trains on what selects or evaluates
        corpus_sha = Corpus.open(job.index.corpus, job.index.corpus_cache).sha256
        if self.manifest.corpus_sha256 and self.manifest.corpus_sha256 != corpus_sha:
            raise LoopManifestError(
                f"{job.config_file or 'the config'}: index_build.corpus {job.index.corpus} is not the corpus this loop "
                f"started on ({self.manifest.path} records sha256 {self.manifest.corpus_sha256[:12]}, the file has "
                f"{corpus_sha[:12]}); a loop keeps one corpus: restore it, or start a new loop folder (loop.out)")
        self.manifest.corpus_sha256 = corpus_sha
        base = Path(job.loop.base_index)

        def build_base(_: Path) -> dict:
            built = build_index(dataclasses.replace(job.index, out=str(base)))
            return {"index": str(base), "passages": built.rows}

        self.step(0, "base_index", {"index": changed_settings(job.index, ("out",)), "out": str(base),
                                    "corpus": corpus_sha}, build_base, artifact=base,
                  identity=lambda _: stable_hash(index_identity(IndexManifest.load(base))))

        def initial_agent(folder: Path) -> dict:
            folder.mkdir(parents=True, exist_ok=True)
            if job.warm_start is None:
                return {"model": job.agent_train.agent.model}
            from agent.sft import warm_start_agent

            return {"model": str(warm_start_agent(job.warm_start))}

        settings = (changed_settings(job.warm_start) if job.warm_start is not None
                    else {"model": job.agent_train.agent.model})
        self.step(0, "initial_agent", {"agent": settings}, initial_agent, artifact=self.folder / "iter_0",
                  identity=lambda summary: model_fingerprint(summary["model"]))

    # ------------------------------------------------------------------------------------------------- iterations
    def iteration(self, i: int, service: LoopService) -> None:
        """The steps of `ITERATION` in order, each run unless done with its inputs' key; then the report."""
        it = Iteration(self.job, i, service, self.record, self.manifest.corpus_sha256,
                       reach=self.step_servers.reachable if self.step_servers else None)
        service.serve(it.previous_index)
        for step in ITERATION:
            it.done[step.name] = self.step(i, step.name, step.inputs(it), lambda out, run=step.run: run(it, out))
        write_report(self.manifest, self.job.loop.iterations)


def run_loop(job: LoopJob, from_iteration: int | None = None, from_step: str | None = None) -> dict:
    """Run (or continue) the loop of `job`; returns the report (also written as ``loop_report.{md,json,png}``).

    ``from_iteration`` and ``from_step`` force a redo of that step and everything after it (into new folders).
    One loop per folder: the run holds ``loop.lock`` in it throughout, and a second run on the same folder is
    refused with WriterLockedError naming the first one's pid (a requeued job beside the old one)."""
    loop = job.loop
    if loop.iterations < 1:
        raise ValueError(f"loop.iterations must be at least 1, got {loop.iterations}")
    if (from_iteration is None) != (from_step is None):
        raise ValueError("give both --from-iteration and --from-step, or neither")
    if from_step is not None and (from_step not in STEPS or not 1 <= from_iteration <= loop.iterations):
        raise ValueError(f"--from-iteration must be 1..{loop.iterations} and --from-step one of {', '.join(STEPS)}; "
                         f"got {from_iteration} and {from_step!r}")
    if not job.agent_train.qa:
        raise ValueError("loop: the agent_train section must name the RL training questions (agent_train.qa)")
    folder = Path(loop.out)
    with WriterLock(folder / LOCK_FILE, f"the loop folder {folder}"):
        return _run_loop(job, from_iteration, from_step)


def _run_loop(job: LoopJob, from_iteration: int | None, from_step: str | None) -> dict:
    """`run_loop` once its arguments are checked and this process is the loop folder's one writer."""
    loop = job.loop
    state = _Loop(job)
    if from_step is not None:
        state.manifest.force(from_iteration, from_step)
    # a scheduler's SIGTERM, a hang-up or Ctrl-C stops every process the loop started (servers, shards, verl)
    specs = step_server_specs(loop.step_servers, STEPS)
    connect_cluster(loop)
    ray = loop.ray if loop.placement == "ray" else None
    with signals_stop_children(), StepServers(specs, state.folder / "step_servers", ray) as servers:
        state.step_servers = servers
        state.inputs()
        with LoopService(loop.service, loop.base_index, for_cluster=ray is not None,
                         index_roots=[str(state.folder)]) as service:
            for i in range(1, loop.iterations + 1):
                state.iteration(i, service)
            swaps = service.swaps
    report = write_report(state.manifest, loop.iterations)
    print(f"loop done: {state.folder} ({len(swaps)} index swaps in this run); report in "
          f"{state.folder / 'loop_report.md'}", flush=True)
    return report
