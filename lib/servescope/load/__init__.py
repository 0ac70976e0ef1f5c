"""Load generation and serving metrics."""

from .datasets import Prompt, load_tokenizer, random_prompts
from .metrics import summarize
from .runner import run_level, run_sweep

__all__ = ["Prompt", "load_tokenizer", "random_prompts", "run_level", "run_sweep", "summarize"]
