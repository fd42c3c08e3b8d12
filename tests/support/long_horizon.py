"""A long-horizon stand-in: an env that never ends by itself and a policy whose every reply is numbered,
so a test can tell which turns a prompt holds (tests/rollout/test_context_policies.py,
tests/trainer/test_step_wise.py)."""

from __future__ import annotations

from agentgym.client import PolicyClient
from agentgym.envs.base import TextEnv, reply_text
from agentgym.model import load_tokenizer
from agentgym.rollout import RolloutConfig, RolloutRunner, Task

TOK = load_tokenizer("tiny")


def ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


class CountingEnv(TextEnv):
    """Never ends by itself: turn k's observation is ``obs-k``; the summary names only how many turns."""

    max_turns = 12

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return [{"role": "system", "content": "SYS"}, {"role": "user", "content": "TASK-go"}], {}

    def step(self, action):
        self.turn += 1
        assert reply_text(action).startswith("reply-")
        return [{"role": "user", "content": f"obs-{self.turn}"}], 0.0, False, False, {"success": False}

    def summarize(self, history):
        return f"SUMMARY of {sum(m['role'] == 'assistant' for m in history)} turns"


def numbered_policy(request):
    """Reply k is ``reply-k``; its logprobs are unique to the request, so turns match requests."""
    k = numbered_policy.count
    numbered_policy.count += 1
    tokens = ids(f"reply-{k}<|im_end|>")
    return tokens, [-(k + 1) / 100 - j / 1e6 for j in range(len(tokens))], "stop"


numbered_policy.count = 0


async def run_episodes(server, policy: str, window: int, turns: int = 8, tasks: int = 1, n: int = 1, **limits):
    """``tasks`` x ``n`` CountingEnv episodes of ``turns`` turns against the stand-in ``server``; ``limits``:
    ``prompt_length`` / ``response_length`` for the ``RolloutConfig``."""
    numbered_policy.count = 0
    server.policy = numbered_policy
    config = RolloutConfig(
        n=n,
        max_turns=turns,
        env_executor="inline",
        context_policy=policy,
        context_window=window,
        max_tokens=16,
        **limits,
    )
    async with PolicyClient(server.url) as client:
        runner = RolloutRunner(CountingEnv, client, TOK, config)
        result = await runner.run([Task(seed=s) for s in range(tasks)])
        await runner.aclose()
    assert all(t.status != "failed" for t in result.trajectories), [t.failure for t in result.trajectories]
    return result.trajectories


def requests_by_logprob(requests) -> dict[float, dict]:
    """The stand-in's recorded requests by the first logprob it answered (unique per request)."""
    return {r["logprobs"][0]: r for r in requests if r["status"] == 200 and r["logprobs"]}
