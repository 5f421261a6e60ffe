"""LLM generation behind one protocol (`LLM`, `SamplingParams`, `Generation`): transformers, vLLM, OpenAI HTTP."""

from .loader import LLMConfig, load_llm
from .protocol import LLM, Generation, Prompt, SamplingParams, generate_checked

__all__ = ["LLM", "Generation", "LLMConfig", "Prompt", "SamplingParams", "generate_checked", "load_llm"]
