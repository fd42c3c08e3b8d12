"""Model presets and loading: the built-in ``tiny`` model and any Hugging Face model path."""

from agentgym.model.loading import load_causal_lm, load_tokenizer, resolve_model_path
from agentgym.model.tiny import is_tiny, tiny_model_path

__all__ = ["is_tiny", "load_causal_lm", "load_tokenizer", "resolve_model_path", "tiny_model_path"]
