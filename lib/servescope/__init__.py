"""servescope: find out why an LLM inference server leaves its GPUs underused, and what to change."""

__version__ = "0.1.0"
