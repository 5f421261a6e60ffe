"""Data preparation: the embedded default corpus and QA sets."""
