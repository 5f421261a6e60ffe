"""Evaluation: retrieval metrics (Recall@k, MRR@k, nDCG@k) and, later, QA metrics."""
