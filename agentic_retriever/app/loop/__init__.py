"""The iterative agent <-> retriever co-training loop: Algorithm 1 of "Agentic-R: Learning to Retrieve for Agentic
Search" (arXiv 2601.11888, section 4.2), one resumable command (`agentic-retriever loop --config FILE`).

For i = 1..K: train Agent_i with RL against the retriever Agentic-R_{i-1} (served by one retrieval service that
runs through the loop); roll Agent_i out on the training questions; mine retriever training rows from those
trajectories (candidates from Agentic-R_{i-1}, local relevance, global answer correctness); train Agentic-R_i;
re-encode the corpus with it and swap the service onto the new index; evaluate. Every step is recorded in
``loop.json`` (`manifest`) with the content hash of its inputs and settings, its versioned artifact folder
(``iter_i/STEP/KEY``) and its wall time; a killed run continues where it stopped, and a changed setting recomputes
from the first step it affects. docs/loop.md has the details.

    from agentic_retriever.app.loop import run_loop
    report = run_loop(job)   # a LoopJob: the loop section plus the step sections of one config file
"""

from .config import LoopConfig, LoopEvalConfig, LoopJob, LoopServiceConfig
from .manifest import MANIFEST_FILE, LoopManifest, LoopManifestError
from .report import status_table, write_report
from .runner import run_loop
from .steps import STEPS

__all__ = ["MANIFEST_FILE", "STEPS", "LoopConfig", "LoopEvalConfig", "LoopJob", "LoopManifest", "LoopManifestError",
           "LoopServiceConfig", "run_loop", "status_table", "write_report"]
