"""Contrastive retriever training (agentic_r.txt section 4.1.2): mined rows -> a drop-in encoder folder.

Modules: `data` (rows -> examples), `losses` (Eq. 5 on sentence-transformers' losses), `trainer`
(`train_retriever`), `export` (the sentence-transformers folder with settings and model card), `curves`.
Import `trainer` / `losses` lazily: they pull in sentence-transformers and torch.
"""

from .data import TrainingExample, read_training_examples

__all__ = ["TrainingExample", "read_training_examples"]
