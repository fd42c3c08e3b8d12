"""``agentgym serve``: run a policy server (embedded, vllm or sglang) in the foreground
(``agentgym.server.launch.serve_command``), on ``--model`` or a finished run's model (``--run``)."""

from __future__ import annotations

import argparse
import sys

from agentgym.stages.from_run import Given


def memory_bytes(value: str) -> int:
    """``--kv-cache-memory-bytes`` read at the door: a bad size is a usage error, not a traceback at start."""
    from agentgym.server.kv_cache import parse_bytes

    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentgym.server.limits import ServerLimits

    limits = ServerLimits()
    p = parser
    p.set_defaults(given=frozenset())
    p.add_argument(
        "--model",
        action=Given,
        default="tiny",
        help="'%(default)s' (default), an HF model directory (a LoRA run's adapter "
        "directory too: embedded merges it into its base) or a hub name",
    )
    p.add_argument(
        "--run",
        default=None,
        metavar="DIR",
        help="serve a finished run's final model (or the checkpoint DIR names) with its context length "
        "(data.max_prompt_length + data.max_response_length); flags given win",
    )
    p.add_argument("--engine", choices=["embedded", "vllm", "sglang"], default="embedded")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--tool-call-parser", default="hermes")
    p.add_argument("--max-batch-size", type=int, default=32, help="embedded: most sequences decoded together")
    p.add_argument("--device", default=None, help="embedded: cpu or cuda (default: cuda if available)")
    p.add_argument(
        "--kv-cache-memory-bytes",
        type=memory_bytes,
        default=None,
        metavar="BYTES",
        help="embedded and vllm: the KV cache's memory, as vLLM's flag: bytes, or 4G (GiB) / 4g (GB) "
        "(embedded default: a quarter of the memory available at start, at most what every slot at --max-model-len "
        "takes; sglang takes none: --gpu-memory-utilization)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="embedded on a CPU: torch threads for the model (default: torch's, one per core; fewer cost less CPU "
        "per token, see docs/results.md)",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="weights and compute dtype (default: vllm/sglang the model's own; embedded float32 on CPU, "
        "bfloat16 on a GPU)",
    )
    p.add_argument(
        "--served-model-name", default=None, help="the name the OpenAI API answers to, as in vLLM (default: --model)"
    )
    p.add_argument(
        "--admin-key",
        default=None,
        help="embedded: key for the weight/pause routes "
        "(default: $AGENTGYM_SERVER_ADMIN_KEY, else a new one, printed at start)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=limits.max_body_bytes,
        help="embedded: largest request body (%(default)s bytes)",
    )
    p.add_argument(
        "--max-prompt-chars",
        type=int,
        default=limits.max_prompt_chars,
        help="embedded: longest prompt text (default: 32 characters per token of the context)",
    )
    p.add_argument(
        "--allow-client-chat-template",
        action="store_true",
        help="embedded: accept a Jinja template in chat_template_kwargs.chat_template (off)",
    )
    p.add_argument(
        "--max-pause-s",
        type=float,
        default=limits.max_pause_s,
        help="embedded: a pause nobody resumes ends after this long (%(default)g s)",
    )
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="vllm/sglang: one more argument for the engine's own command line (repeatable; "
        "write --engine-arg=--enforce-eager)",
    )


def run(args: argparse.Namespace) -> int:
    from agentgym.server.launch import serve_command
    from agentgym.stages.from_run import RunError, settle_serve_args

    try:
        settle_serve_args(args)  # --run: the run's model and context length
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return serve_command(args)
