"""A stand-in ``vllm`` package for tests: only ``vllm.entrypoints.openai.api_server`` (see there)."""
