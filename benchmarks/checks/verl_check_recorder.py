"""The batches verl's trainer compares rollout and actor log-probs on, recorded for `verl_check.py` (check only).

verl 0.9.1's V1 trainer computes ``training/rollout_probs_diff_*`` with ``verl.utils.debug.metrics.
calculate_debug_metrics(data)`` on the step's batch after the actor's old log-prob pass: ``responses``,
``response_mask`` (what the policy loss masks with), ``rollout_log_probs`` (vLLM's) and ``old_log_probs`` (FSDP's).
Named in ``VERL_USE_EXTERNAL_MODULES`` (verl imports it in every process, before its trainer module binds the
function), this module wraps that function to save those four tensors of every call under
``$VERL_CHECK_RECORD_DIR/batch_<pid>_<n>.pt`` and returns verl's own metrics unchanged. verl's files are not touched.
"""

from __future__ import annotations

import functools
import itertools
import os
from pathlib import Path

import torch

import verl.utils.debug.metrics as debug_metrics

FIELDS = ("responses", "response_mask", "rollout_log_probs", "old_log_probs")
_calls = itertools.count()


def _record(data) -> None:
    folder = Path(os.environ["VERL_CHECK_RECORD_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: data.batch[name].detach().cpu() for name in FIELDS if name in data.batch.keys()}
    path = folder / f"batch_{os.getpid()}_{next(_calls)}.pt"
    torch.save(tensors, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").rename(path)


def _wrap(original):
    @functools.wraps(original)
    def calculate_debug_metrics(data):
        _record(data)
        return original(data)
    calculate_debug_metrics._recorded = True
    return calculate_debug_metrics


if not getattr(debug_metrics.calculate_debug_metrics, "_recorded", False):
    debug_metrics.calculate_debug_metrics = _wrap(debug_metrics.calculate_debug_metrics)
