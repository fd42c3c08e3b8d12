"""Loaded inside vLLM's worker processes (``--worker-extension-cls``): keep its imports to what a
vLLM install has."""

from __future__ import annotations

import inspect


class VLLMWorkerWeights:
    """A vLLM worker extension (``--worker-extension-cls``): vLLM mixes it into every worker,
    so ``self.model_runner`` is the worker's. ``collective_rpc`` passes only strings."""

    def agentgym_load_weights(self, path: str) -> int:
        from agentgym.model.weights import load_weights

        state = load_weights(path)
        runner = self.model_runner  # type: ignore[attr-defined]
        tied = getattr(getattr(runner.model_config, "hf_config", None), "tie_word_embeddings", False)
        if tied and "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
            # vLLM's CPU backend keeps a repacked lm_head apart from the embedding it is tied to:
            # reloading only the embedding would leave the output layer on the old weights
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        reload = getattr(runner, "reload_weights", None)
        if reload is not None and "weights_iterator" in inspect.signature(reload).parameters:
            # vLLM >= 0.12: in-place layerwise reload that redoes kernel-format processing (repacking)
            reload(weights_iterator=iter(state.items()), is_checkpoint_format=True)
            return len(state)
        model = runner.model
        model.load_weights(weights=iter(state.items()))
        try:  # re-run post-load processing (quantization, repacking) where this vLLM has it
            from vllm.model_executor.model_loader.utils import process_weights_after_loading

            device = next(model.parameters()).device
            process_weights_after_loading(model, runner.model_config, device)
        except (ImportError, TypeError, AttributeError):
            pass
        return len(state)
