"""The rollout runner: token-exact trajectories, template deltas and checks, limits, failure isolation.

A stand-in policy server (tests/support/standin_server.py, in a thread) answers over real HTTP
through the real PolicyClient and records every request body, so the tests compare the
stored trajectories with exactly what the server saw and returned.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from transformers import AutoTokenizer

import agentgym
from agentgym.client import PolicyClient
from agentgym.envs.base import TextEnv, reply_text
from agentgym.model import load_tokenizer, resolve_model_path
from agentgym.rollout import ChatTokenizer, RolloutConfig, RolloutRunner, Task, pass_at_k, summarize
from agentgym.rollout.runner import assistant_message
from tests.support.shared_data import GSM8K_TEST

GSM8K = str(GSM8K_TEST)
TOK = load_tokenizer("tiny")
IM_END = TOK.convert_tokens_to_ids("<|im_end|>")


def ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


REPLIES = [  # (text, finish_reason): a tool call, a move, a cut-off reply (no <|im_end|>), an answer
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "16-3-4"}}\n</tool_call><|im_end|>', "stop"),
    ("<answer>Up</answer><|im_end|>", "stop"),
    ("<think>Let me see, 16 - 3", "length"),
    ("So the answer is #### 18<|im_end|>", "stop"),
]


def cycling_policy(request: dict) -> tuple[list[int], list[float], str]:
    """Replies in turn; request k's logprobs are unique (-(k+1)/1000 - j/1e7), to match turns to requests."""
    k = cycling_policy.count
    cycling_policy.count += 1
    text, finish = REPLIES[k % len(REPLIES)]
    tokens = ids(text)[: request["max_tokens"]]
    return tokens, [-(k + 1) / 1000 - j / 1e7 for j in range(len(tokens))], finish


cycling_policy.count = 0


def check_token_exact(trajectories, requests) -> None:
    """Each turn's request prompt is the stored sequence so far; responses and logprobs are the server's."""
    by_first_logprob = {r["logprobs"][0]: r for r in requests if r["status"] == 200 and r["logprobs"]}
    for traj in trajectories:
        assert traj.turns, traj.failure
        sent: list[int] = []
        for turn in traj.turns:
            sent += turn.prompt_ids
            record = by_first_logprob[turn.logprobs[0]]
            assert record["request"]["prompt"] == sent  # exactly what the server saw on this turn
            assert turn.response_ids == record["token_ids"]
            assert turn.logprobs == record["logprobs"]
            assert turn.finish_reason == record["finish_reason"]
            sent += turn.response_ids
        # the final turn: stored prompt + response tokens == final request + its answer
        assert traj.token_ids() == sent
        mask = traj.loss_mask()
        assert [t for t, m in zip(traj.token_ids(), mask) if m] == [t for u in traj.turns for t in u.response_ids]
        assert sum(mask) == sum(len(u.response_ids) for u in traj.turns)
        assert [lp for lp, m in zip(traj.token_logprobs(), mask) if m] == [x for u in traj.turns for x in u.logprobs]
        assert traj.metrics["template_mismatch"] == 0.0


def env_kwargs_for(name: str) -> dict:
    return {} if name.startswith("sokoban") else {"data_files": GSM8K}


@pytest.mark.parametrize("env_name", ["sokoban", "gsm8k", "gsm8k_tool", "gsm8k_interaction"])
async def test_stored_tokens_are_exactly_what_the_server_saw(env_name, standin_server):
    if not env_name.startswith("sokoban") and not GSM8K_TEST.is_file():
        pytest.skip(f"GSM8K test data not found at {GSM8K_TEST}")
    cycling_policy.count = 0
    standin_server.policy = cycling_policy
    config = RolloutConfig(n=3, max_turns=4, max_tokens=64, max_concurrency=4)
    async with PolicyClient(standin_server.url) as client:
        runner = RolloutRunner(env_name, client, "tiny", config, env_kwargs=env_kwargs_for(env_name))
        result = await runner.run(tasks=2)
        await runner.aclose()
    trajs = result.trajectories
    assert len(trajs) == 6 and all(t.status != "failed" for t in trajs), [t.failure for t in trajs]
    check_token_exact(trajs, standin_server.requests)
    groups = result.groups()
    assert len(groups) == 2 and all(len(g) == 3 for g in groups.values())
    for group in groups.values():
        assert len({(t.seed, t.task["index"]) for t in group}) == 1
        assert sorted(t.task["sample"] for t in group) == [0, 1, 2]
    assert all(turn.weight_version == 1 for t in trajs for turn in t.turns)
    assert result.metrics["episodes"] == 6 and result.metrics["template_mismatch"] == 0


async def test_cut_off_reply_is_closed_by_the_delta(standin_server):
    """A reply cut by max_tokens has no <|im_end|>: the next delta starts with the template's closing."""
    replies = iter([(ids("<answer>Up"), "length"), (ids("<answer>Up</answer><|im_end|>"), "stop")] * 4)

    def policy(request):
        tokens, finish = next(replies)
        return tokens, [-0.25] * len(tokens), finish

    standin_server.policy = policy
    async with PolicyClient(standin_server.url) as client:
        runner = RolloutRunner("sokoban", client, "tiny", RolloutConfig(max_turns=3, env_executor="inline"))
        traj = (await runner.run([Task(seed=3)])).trajectories[0]
    assert traj.num_turns == 3
    first, second, third = traj.turns
    assert first.response_ids[-1] != IM_END and first.finish_reason == "length"
    assert second.prompt_ids[:2] == ids("<|im_end|>\n")  # closing first, then the env's message
    assert second.response_ids[-1] == IM_END
    assert third.prompt_ids[0] != IM_END and TOK.decode(third.prompt_ids).startswith("\n<|im_start|>user")
    assert traj.metrics["template_mismatch"] == 0.0
    # the whole sequence reads exactly like the chat template's rendering of the conversation
    raw = [
        m if m["role"] != "assistant" else {"role": "assistant", "content": c}
        for m, c in zip(traj.messages, _assistant_texts(traj))
    ]
    rendered = TOK.apply_chat_template(raw, tools=agentgym.make("sokoban").tools, tokenize=False)
    assert rendered.startswith(TOK.decode(traj.token_ids()))


def _assistant_texts(traj):
    texts = iter(t.response_text.removesuffix("<|im_end|>") for t in traj.turns)
    return [next(texts) if m["role"] == "assistant" else None for m in traj.messages]


def think_stripping_tokenizer():
    """The tiny tokenizer with a Qwen3-like template: earlier assistant turns lose their <think> block."""
    tok = AutoTokenizer.from_pretrained(resolve_model_path("tiny"))
    template = tok.chat_template
    marker = "{{- message['content'] or '' }}"
    assert template.count(marker) == 1
    strip = (
        "{%- set content = message['content'] or '' %}"
        "{%- if loop.index0 < ns.last_user and '</think>' in content %}"
        "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
        "{{- content }}"
    )
    prelude = (
        "{%- set ns = namespace(last_user=-1) %}"
        "{%- for m in messages %}{%- if m['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}"
        "{%- endif %}{%- endfor %}"
    )
    tok.chat_template = prelude + template.replace(marker, strip)
    return tok


async def test_template_that_drops_think_blocks_is_detected(standin_server):
    reply = ids("<think>Up looks good.</think><answer>Up</answer><|im_end|>")
    cycling = iter(range(10**6))

    def policy(request):
        k = next(cycling)
        return reply, [-(k + 1) / 1000] * len(reply), "stop"

    standin_server.policy = policy
    tok = think_stripping_tokenizer()
    async with PolicyClient(standin_server.url) as client:
        runner = RolloutRunner("sokoban", client, tok, RolloutConfig(n=2, max_turns=3, env_executor="inline"))
        result = await runner.run([Task(seed=5)])
    trajs = result.trajectories
    for traj in trajs:
        assert traj.num_turns == 3 and traj.trainable
        assert traj.metrics["template_mismatch"] == 1.0  # a re-render would drop the first <think>
        assert traj.turns[0].response_ids == reply  # but the tokens are what was sampled
    assert result.metrics["template_mismatch"] == 2
    # what each request carried is still the stored sequence
    by_lp = {r["logprobs"][0]: r["request"]["prompt"] for r in standin_server.requests}
    for traj in trajs:
        sent: list[int] = []
        for turn in traj.turns:
            sent += turn.prompt_ids
            assert by_lp[turn.logprobs[0]] == sent
            sent += turn.response_ids
    # a single-turn episode never re-renders an earlier assistant turn: no mismatch
    async with PolicyClient(standin_server.url) as client:
        runner = RolloutRunner("sokoban", client, tok, RolloutConfig(max_turns=1, env_executor="inline"))
        single = (await runner.run([Task(seed=5)])).trajectories[0]
    assert single.metrics["template_mismatch"] == 0.0


def test_delta_cache_and_prefix_property():
    chat = ChatTokenizer(TOK)
    tools = agentgym.make("sokoban").tools
    system = [{"role": "system", "content": "Play."}, {"role": "user", "content": "board 1"}]
    prompt = chat.prompt_ids(system, tools)
    reply = ids("<answer>Up</answer><|im_end|>")
    obs = [{"role": "user", "content": "board 2"}]
    delta = chat.delta_ids(obs, tools, reply[-1])
    assert chat.delta_ids(obs, tools, reply[-1]) is delta and chat.cache_hits == 1
    convo = system + [{"role": "assistant", "content": "<answer>Up</answer>"}] + obs
    expected = TOK.apply_chat_template(convo, tools=tools, add_generation_prompt=True, tokenize=False)
    assert TOK.decode(prompt + reply + delta) == expected
    tool_obs = [{"role": "tool", "tool_call_id": "c0", "content": "24"}, {"role": "tool", "content": "25"}]
    delta = chat.delta_ids(tool_obs, tools, None)  # an unclosed reply: the closing comes first
    assert TOK.decode(delta).startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n24")


def test_assistant_message_parses_hermes_tool_calls_only_for_envs_with_tools():
    text = 'Moving. <tool_call>\n{"name": "move", "arguments": {"direction": "up"}}\n</tool_call>'
    message = assistant_message(text, with_tools=True)
    assert message["tool_calls"][0]["function"]["name"] == "move"
    assert message["content"] == "Moving."
    assert assistant_message(text, with_tools=False) == {"role": "assistant", "content": text}
    broken = "<tool_call>{not json}</tool_call>"
    assert assistant_message(broken, with_tools=True) == {"role": "assistant", "content": broken}


# ---- failure isolation ----------------------------------------------------------------------
class FlakyEnv(TextEnv):
    """Counts to 3; seed 13 raises on its second step, seed 17 hangs on its second step."""

    def reset(self, seed=None, options=None):
        self.seed_, self.turn = seed, 0
        return [{"role": "user", "content": f"Task {seed}: say anything."}], {}

    def step(self, action):
        self.turn += 1
        if self.turn == 2 and self.seed_ == 13:
            raise RuntimeError("env exploded")
        if self.turn == 2 and self.seed_ == 17:
            time.sleep(1.0)
        done = self.turn >= 3
        info = {"outcome_reward": 1.0, "success": True} if done else {}
        return [{"role": "user", "content": f"turn {self.turn}: {reply_text(action)[:10]}"}], 0.5, done, False, info


def fixed_policy(request):
    tokens = ids("fine<|im_end|>")
    cut = tokens[: request["max_tokens"]]
    return cut, [-0.1] * len(cut), "stop" if cut == tokens else "length"


@pytest.mark.parametrize("executor", ["thread", "inline"])
async def test_failing_env_leaves_the_rest_of_the_batch_intact(executor, standin_server):
    standin_server.policy = fixed_policy
    seeds = [11, 13, 15] + ([17] if executor == "thread" else [])
    config = RolloutConfig(n=2, env_executor=executor, env_timeout=0.3, max_concurrency=8)
    async with PolicyClient(standin_server.url) as client:
        runner = RolloutRunner(FlakyEnv, client, "tiny", config)
        result = await runner.run([Task(seed=s) for s in seeds])
        await runner.aclose()
    by_seed = {}
    for t in result.trajectories:
        by_seed.setdefault(t.seed, []).append(t)
    assert len(result.trajectories) == 2 * len(seeds)
    for t in by_seed[13]:
        assert t.status == "failed" and not t.trainable
        assert "env.step raised: RuntimeError: env exploded" in t.failure
        assert t.num_turns == 2  # the turns so far are kept for inspection
    if executor == "thread":
        assert all(t.status == "failed" and "timed out" in t.failure for t in by_seed[17])
    for seed in (11, 15):
        assert all(t.status == "ok" and t.trainable and t.num_turns == 3 for t in by_seed[seed])
        assert all(t.outcome_reward == 1.0 and t.total_reward == 2.5 for t in by_seed[seed])
    assert result.metrics["failed"] == 2 * (len(seeds) - 2)
    assert len(result.trainable()) == 4


async def test_server_error_after_retries_fails_only_the_affected_episodes(standin_server):
    poison = ids("Task 13")

    def policy(request):
        prompt = request["prompt"]
        if any(prompt[i : i + len(poison)] == poison for i in range(len(prompt))):
            return 503
        return fixed_policy(request)

    standin_server.policy = policy
    async with PolicyClient(standin_server.url, max_retries=1) as client:
        runner = RolloutRunner(FlakyEnv, client, "tiny", RolloutConfig(n=2, env_executor="inline"))
        result = await runner.run([Task(seed=s) for s in (11, 13, 15)])
    failed = [t for t in result.trajectories if t.status == "failed"]
    assert {t.seed for t in failed} == {13} and len(failed) == 2
    assert all("policy server raised: PolicyServerError" in t.failure and "HTTP 503" in t.failure for t in failed)
    assert sum(r["status"] == 503 for r in standin_server.requests) == 4  # 2 episodes x (1 try + 1 retry)
    assert all(t.status == "ok" for t in result.trajectories if t.seed != 13)


# ---- limits --------------------------------------------------------------------------------
async def test_limits_truncate_or_fail(standin_server):
    standin_server.policy = fixed_policy
    async with PolicyClient(standin_server.url) as client:
        tight = RolloutRunner(FlakyEnv, client, "tiny", RolloutConfig(response_length=20, env_executor="inline"))
        traj = (await tight.run([Task(seed=1)])).trajectories[0]
        assert traj.status == "truncated" and traj.response_length() < 20
        cut = RolloutRunner(FlakyEnv, client, "tiny", RolloutConfig(response_length=3, env_executor="inline"))
        traj = (await cut.run([Task(seed=1)])).trajectories[0]
        assert traj.status == "truncated" and traj.num_turns == 1
        assert standin_server.requests[-1]["request"]["max_tokens"] == 3  # the generation is cut to the budget
        turns = RolloutRunner(FlakyEnv, client, "tiny", RolloutConfig(max_turns=2, env_executor="inline"))
        traj = (await turns.run([Task(seed=1)])).trajectories[0]
        assert traj.status == "truncated" and traj.num_turns == 2
        short = RolloutRunner(FlakyEnv, client, "tiny", RolloutConfig(prompt_length=5, env_executor="inline"))
        traj = (await short.run([Task(seed=1)])).trajectories[0]
        assert traj.status == "failed" and "prompt_length=5" in traj.failure and not traj.turns
        # the server's context: every request leaves room for its max_tokens, and a full context ends
        # the episode as truncated (not as a 400 from the server and a failed episode)
        prompt = len(standin_server.requests[-1]["request"]["prompt"])
        limit = prompt + 12
        held = RolloutRunner(FlakyEnv, client, "tiny", RolloutConfig(max_model_len=limit, env_executor="inline"))
        before = len(standin_server.requests)
        traj = (await held.run([Task(seed=1)])).trajectories[0]
        assert traj.status == "truncated" and traj.num_turns >= 1 and len(traj.token_ids()) <= limit
        for seen in standin_server.requests[before:]:
            assert len(seen["request"]["prompt"]) + seen["request"]["max_tokens"] <= limit


async def test_process_executor_runs_sokoban(standin_server):
    standin_server.token_ids = ids("<answer>Up</answer><|im_end|>")
    config = RolloutConfig(n=2, max_turns=2, env_executor="process", env_workers=1)
    async with PolicyClient(standin_server.url) as client:
        runner = RolloutRunner("sokoban", client, "tiny", config)
        result = await runner.run(tasks=2)
        await runner.aclose()
    assert [t.status for t in result.trajectories].count("failed") == 0
    assert all(t.messages[0]["role"] == "system" for t in result.trajectories)


async def test_slow_env_does_not_stall_the_others(standin_server):
    """With the thread executor, the other episodes finish while a slow env's steps (3 x 0.4 s) run."""
    standin_server.policy = fixed_policy

    class SlowEnv(FlakyEnv):
        def step(self, action):
            if self.seed_ == 0:
                time.sleep(0.4)
            return super().step(action)

    done = {}
    async with PolicyClient(standin_server.url) as client:
        runner = RolloutRunner(SlowEnv, client, "tiny", RolloutConfig(max_concurrency=8))
        start = time.perf_counter()
        result = await runner.run(
            [Task(seed=s) for s in range(8)],
            on_trajectory=lambda t: done.setdefault(t.seed, time.perf_counter() - start),
        )
        await runner.aclose()
    assert all(t.status == "ok" for t in result.trajectories)
    assert done[0] >= 1.2
    assert max(done[s] for s in range(1, 8)) < done[0] - 0.4  # not queued behind the slow one


# ---- metrics -------------------------------------------------------------------------------
def test_pass_at_k_is_the_unbiased_estimator():
    from itertools import combinations
    from math import comb

    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                brute = sum(any(i < c for i in pick) for pick in combinations(range(n), k)) / comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(brute)
                assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_summarize_per_source_and_pass_at_k():
    from agentgym.types import Trajectory, Turn

    def traj(group, source, ok):
        t = Trajectory(turns=[Turn([1], [2], [-0.1])], group_id=group, data_source=source, outcome_reward=float(ok))
        t.metrics.update(success=float(ok), sampled_tokens=1.0, tokens=2.0)
        return t

    trajs = [traj("a", "s1", True), traj("a", "s1", False), traj("b", "s2", False), traj("b", "s2", False)]
    m = summarize(trajs)
    assert m["success_rate"] == 0.25 and m["pass@1"] == 0.25 and m["pass@2"] == 0.5
    assert m["s1/pass@2"] == 1.0 and m["s2/pass@2"] == 0.0 and m["s1/episodes"] == 2


def test_make_tasks_uses_rows_for_dataset_envs():
    from agentgym.rollout import make_tasks

    assert [t.index for t in make_tasks(3, start=4, num_tasks=5)] == [4, 0, 1]
    assert [t.seed for t in make_tasks(2, seed=10)] == [10, 11]
    assert Task(seed=1, index=2).reset_options() == {"index": 2}


def test_runner_survives_many_concurrent_episodes():
    """64 concurrent episodes on one event loop with the fake client (no HTTP): no shared state leaks."""
    from agentgym.types import TokenSample

    reply = ids("<answer>Left</answer><|im_end|>")

    class FakeClient:
        async def generate(self, prompt_ids, sampling, session_id=None):
            await asyncio.sleep(0)
            return TokenSample(list(reply), [-0.2] * len(reply), "stop", 7)

    async def main():
        runner = RolloutRunner(
            "sokoban", FakeClient(), "tiny", RolloutConfig(n=4, max_turns=5, env_executor="inline", max_concurrency=64)
        )
        return await runner.run(tasks=16)

    result = asyncio.run(main())
    assert len(result.trajectories) == 64
    assert all(t.turns[0].weight_version == 7 for t in result.trajectories)
    # the same task renders the same first prompt in every episode of its group
    for group in result.groups().values():
        assert len({tuple(t.turns[0].prompt_ids) for t in group}) == 1
