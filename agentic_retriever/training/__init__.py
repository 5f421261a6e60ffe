"""Retriever training: mined rows -> a drop-in encoder folder.

The method is "Agentic-R: Learning to Retrieve for Agentic Search", section 4.1.2.

Modules: `data` (rows -> examples, duplicates dropped, utilities for soft labels), `losses` (Eq. 5 on
sentence-transformers' losses, plus REPLUG's soft-label KL), `schedule` (warm-up and decay), `checkpoint_selection`
(held-out model selection: base or best epoch), `trainer` (`train_retriever`), `settings_search`
(`choose_training_settings`), `export` (the sentence-transformers folder with settings and model card);
the training curves are `agentic_retriever.base.curves` (shared with the agent). Import `trainer` / `losses` /
`checkpoint_selection` lazily: they pull in sentence-transformers and torch.
"""

from .data import TrainingExample, passage_utility, read_training_examples

__all__ = ["TrainingExample", "passage_utility", "read_training_examples"]
