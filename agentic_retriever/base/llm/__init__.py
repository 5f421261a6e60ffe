"""LLM generation behind one protocol (`LLM`, `SamplingParams`, `Generation`): transformers, vLLM, OpenAI HTTP."""

from .protocol import LLM, Generation, Prompt, SamplingParams, generate_checked
from .loader import LLMConfig, load_llm

__all__ = ["LLM", "Generation", "LLMConfig", "Prompt", "SamplingParams", "generate_checked", "load_llm"]
