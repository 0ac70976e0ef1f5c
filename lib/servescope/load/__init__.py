"""Load generation and serving metrics."""

from .datasets import Prompt, jsonl_prompts, load_tokenizer, random_prompts, sharegpt_prompts
from .metrics import summarize
from .runner import LoadResult, make_prompts, run_coro, run_level, run_sweep

__all__ = ["LoadResult", "Prompt", "jsonl_prompts", "load_tokenizer", "make_prompts", "random_prompts", "run_coro",
           "run_level", "run_sweep", "sharegpt_prompts", "summarize"]
