"""LLM judges (``judge.*``): what the judge reads, how its answers become scores, and that nothing is
lost or made up when it misbehaves. A stand-in judge (an OpenAI chat-completions server in a thread)
grades by the reference answer it is shown and misbehaves on purpose: 500s, answers too slow for the
client's timeout, answers in no format."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentgym.rewards.judge import JudgeScorer, JudgeSettings
from agentgym.rewards.judge_prompts import parse_group, parse_pointwise, split_trajectory
from agentgym.rewards.scored_source import ScoredSource
from agentgym.rollout.sources import FixedTrajectorySource
from agentgym.types import Trajectory, Turn


class StandinJudge:
    """Grades an answer 10 (pointwise) or 1 (group) when it holds the reference shown in the prompt, else
    2 or 0.2. A response containing ``CONFUSE`` gets an answer in no format; ``fail`` maps a response
    marker to the failures its first requests get, in order: ``500`` or ``slow`` (past the timeout)."""

    def __init__(self, fail: dict[str, list[str]] | None = None) -> None:
        self.fail = {k: list(v) for k, v in (fail or {}).items()}
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                self._send(200, {"data": [{"id": "standin-judge"}]})

            def do_POST(self):  # noqa: N802
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, answer = judge.answer(request)
                if status == "slow":
                    time.sleep(1.5)
                    status = 200
                if status != 200:
                    self._send(status, {"error": {"message": "judge overloaded"}})
                    return
                self._send(200, {"choices": [{"message": {"role": "assistant", "content": answer}}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, request: dict) -> tuple[int | str, str]:
        prompt = request["messages"][-1]["content"]
        with self.lock:
            self.requests.append(request)
            for marker, failures in self.fail.items():
                if marker in prompt and failures:
                    return failures.pop(0) if failures[0] == "slow" else int(failures.pop(0)), ""
        ref = re.search(r"# Reference answer\n(.*)\n", prompt)
        reference = ref.group(1) if ref else "@@"
        attempts = re.findall(r'<attempt id="(\d+)">\n(.*?)\n</attempt>', prompt, re.S)
        if attempts:
            if any("CONFUSE" in text for _, text in attempts):
                return 200, "They all look fine to me."
            scores = [
                {"id": int(k), "explanation": "-", "score": 1.0 if reference in text else 0.2} for k, text in attempts
            ]
            return 200, "```json\n" + json.dumps({"scores": scores}) + "\n```"
        response = prompt.split("# Response\n", 1)[1]
        if "CONFUSE" in response:
            return 200, "Hard to say, it depends."
        return (
            200,
            f"The final answer {'matches' if reference in response else 'does not match'}.\nSCORE: "
            f"{10 if reference in response else 2}",
        )

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def judge():
    server = StandinJudge()
    yield server
    server.stop()


def gsm8k_episode(reply: str, group: str = "q1", truth: str = "18", outcome: float = 0.0) -> Trajectory:
    """A GSM8K-like episode as env rollouts record it (the env's ground truth in ``task``)."""
    messages = [
        {"role": "user", "content": "Janet has 16 eggs and buys 2 more. How many eggs? Answer after '####'."},
        {"role": "assistant", "content": reply},
    ]
    turn = Turn(prompt_ids=[1, 2, 3], response_ids=[4, 5], logprobs=[-0.5, -0.5], response_text=reply)
    return Trajectory(
        turns=[turn],
        outcome_reward=outcome,
        group_id=group,
        messages=messages,
        task={"seed": 0, "ground_truth": truth},
        data_source="openai/gsm8k",
    )


def scorer(server: StandinJudge, mode: str = "pointwise", cache=None, **kw) -> JudgeScorer:
    return JudgeScorer(
        JudgeSettings(server.url, mode, timeout=kw.pop("timeout", 10.0), max_retries=kw.pop("max_retries", 3), **kw),
        cache,
    )


# ---- what the judge reads and answers ---------------------------------------------------------------
def test_parsers_take_well_formed_answers_only():
    assert parse_pointwise("looks right\nSCORE: 8", 0, 10) == 0.8
    assert parse_pointwise("Score: 3 ... final SCORE: **7**", 0, 10) == 0.7  # the last one counts
    assert parse_pointwise("SCORE: 11", 0, 10) is None and parse_pointwise("no verdict", 0, 10) is None
    assert parse_group('{"scores": [{"id": 2, "score": 0.5}, {"trajectory_id": "1", "score": 1}]}', 2) == [1.0, 0.5]
    assert parse_group('{"scores": [{"id": 1, "score": 0.5}]}', 2) is None  # an attempt left out
    assert parse_group('{"scores": [{"id": 1, "score": 1.5}, {"id": 2, "score": 0}]}', 2) is None
    assert parse_group("no json at all", 1) is None


def test_the_judge_reads_the_task_the_response_and_the_reference(judge):
    traj = gsm8k_episode("16 + 2 = 18\n#### 18")
    task, response = split_trajectory(traj)
    assert "Janet has 16 eggs" in task and response == "16 + 2 = 18\n#### 18"
    asyncio.run(scorer(judge).score([traj]))
    prompt = judge.requests[0]["messages"][-1]["content"]
    assert "# Task\n[user]\nJanet has 16 eggs" in prompt and "# Reference answer\n18\n" in prompt
    assert judge.requests[0]["model"] == "standin-judge"  # the endpoint's first model
    gateway = gsm8k_episode("#### 18")  # a gateway session's task is the dataset row (veRL's layout)
    gateway.task = {"question": "...", "reward_model": {"ground_truth": "18"}}
    asyncio.run(scorer(judge).score([gateway]))
    assert "# Reference answer\n18\n" in judge.requests[-1]["messages"][-1]["content"]
    assert gateway.outcome_reward == 1.0


# ---- pointwise and group scores -----------------------------------------------------------------------
def test_pointwise_scores_become_rewards_and_an_unparsed_answer_keeps_its_episode_out(judge):
    right, wrong, confused = gsm8k_episode("#### 18"), gsm8k_episode("#### 17"), gsm8k_episode("CONFUSE")
    counts = asyncio.run(scorer(judge).score([right, wrong, confused]))
    assert right.outcome_reward == 1.0 and wrong.outcome_reward == pytest.approx(0.2)
    assert confused.status == "failed" and "unparsed" in confused.failure and "it depends" in confused.failure
    assert confused.outcome_reward == 0.0 and "model_score" not in confused.metrics  # not scored, not trained
    assert counts["reward/judge_unparsed"] == 1 and counts["reward/judge_dropped"] == 1
    assert counts["reward/judge_score/mean"] == pytest.approx(0.6)


def test_group_scores_are_relative_and_an_unparsed_group_gets_no_advantage(judge):
    group = [gsm8k_episode(r, "a") for r in ("#### 18", "#### 3", "so 18\n#### 18")]
    confused = [gsm8k_episode(r, "b") for r in ("#### 18", "CONFUSE")]
    counts = asyncio.run(scorer(judge, "group").score(group + confused))
    assert len(judge.requests) == 2  # one request per task's group
    assert [t.outcome_reward for t in group] == [1.0, 0.2, 1.0]
    assert all(t.status == "failed" and "unparsed group answer" in t.failure for t in confused)
    assert counts["reward/judge_unparsed"] == 1 and counts["reward/judge_dropped"] == 2


# ---- a judge that misbehaves ----------------------------------------------------------------------------
def test_nothing_is_lost_on_a_judge_that_times_out_or_returns_500():
    """Every request first fails (500, then an answer past the client's timeout, then 500 again for one
    episode): the retries get every episode its real score. One episode whose requests fail more
    times than the retries allow is counted and kept out, never scored 0."""
    server = StandinJudge({"#### 18": ["500", "slow"], "#### 3": ["slow", "500"], "#### 7": ["500"] * 5})
    try:
        episodes = [gsm8k_episode("#### 18"), gsm8k_episode("#### 3"), gsm8k_episode("#### 7")]
        counts = asyncio.run(scorer(server, timeout=0.5, max_retries=2, backoff=0.01).score(episodes))
    finally:
        server.stop()
    assert episodes[0].outcome_reward == 1.0 and episodes[1].outcome_reward == pytest.approx(0.2)
    assert episodes[2].status == "failed" and "500" in episodes[2].failure
    assert counts["reward/judge_errors"] == 1 and counts["reward/judge_unparsed"] == 0


def test_scores_are_cached_by_content_so_a_resumed_run_pays_once(judge, tmp_path):
    cache = tmp_path / "judge_cache.jsonl"
    first = [gsm8k_episode("#### 18"), gsm8k_episode("#### 4"), gsm8k_episode("CONFUSE")]
    counts = asyncio.run(scorer(judge, cache=cache).score(first))
    assert counts["reward/judge_calls"] == 3 and len(judge.requests) == 3
    again = [gsm8k_episode("#### 18"), gsm8k_episode("#### 4"), gsm8k_episode("CONFUSE"), gsm8k_episode("#### 5")]
    counts = asyncio.run(scorer(judge, cache=cache).score(again))  # a new scorer: a resumed run
    assert counts["reward/judge_cache_hits"] == 3 and counts["reward/judge_calls"] == 1 and len(judge.requests) == 4
    assert [t.outcome_reward for t in again[:2]] == [1.0, pytest.approx(0.2)] and again[2].status == "failed"


def test_as_the_outcome_reward_of_any_source(judge):
    """Around a trajectory source (env rollouts, gateway sessions alike): training episodes are judged,
    validation keeps the env's score, the step's counts reach the trainer."""
    source = ScoredSource(
        FixedTrajectorySource(
            [[gsm8k_episode("#### 18", outcome=1.0), gsm8k_episode("#### 2", outcome=0.0)]],
            validation=[gsm8k_episode("#### 2", outcome=1.0)],
        ),
        scorer(judge),
        "judge",
    )
    out = asyncio.run(source.collect(1))
    assert [t.outcome_reward for t in out] == [1.0, pytest.approx(0.2)]
    assert out[0].metrics["rule_reward"] == 1.0
    assert asyncio.run(source.validate())[0].outcome_reward == 1.0
    assert source.reward_metrics["reward/judge_calls"] == 2


def test_the_training_config_puts_the_judge_around_the_source(judge, tmp_path):
    from agentgym.trainer.config import load_config
    from agentgym.trainer.run import wrap_source

    cfg = load_config(
        env="gsm8k",
        overrides=[
            "judge.enable=true",
            f"judge.base_url={judge.url}",
            "judge.mode=group",
            f"trainer.default_local_dir={tmp_path}",
        ],
        warn=False,
    )
    source = wrap_source(cfg, FixedTrajectorySource([[gsm8k_episode("#### 18"), gsm8k_episode("#### 1")]]))
    out = asyncio.run(source.collect(1))
    assert [t.outcome_reward for t in out] == [1.0, pytest.approx(0.2)] and len(judge.requests) == 1
    assert (tmp_path / "judge_cache.jsonl").read_text().count("\n") == 1
    asyncio.run(source.aclose())


@pytest.fixture(scope="module")
def served_tiny(embedded_server):
    return embedded_server  # the session's (tests/conftest.py)


@pytest.mark.parametrize("mode", ["pointwise", "group"])
def test_a_judge_on_an_agentgym_serve_endpoint_scores_a_gsm8k_eval(served_tiny, mode, capsys):
    """``agentgym eval --env gsm8k --judge-url URL``, the judge an ``agentgym serve`` endpoint (the random
    tiny model, which rarely answers in the judge's format): every episode is either judged or counted
    among the unparsed answers, none is scored without an answer."""
    from agentgym.cli import main
    from tests.support.shared_data import GSM8K_TEST

    if not GSM8K_TEST.is_file():
        pytest.skip(f"GSM8K test data not found at {GSM8K_TEST}")
    url = served_tiny.url
    assert (
        main(
            [
                "eval",
                "--env",
                "gsm8k",
                "--server",
                url,
                "--env-arg",
                f"data_files={GSM8K_TEST}",
                "--tasks",
                "3",
                "-n",
                "2",
                "--max-tokens",
                "16",
                "--env-executor",
                "inline",
                "--judge-url",
                url,
                "--judge-mode",
                mode,
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    found = re.search(
        rf"judge \({mode}, (\S+) at {re.escape(url)}/v1\): (\d+) of 6 episodes judged, unparsed answers "
        r"(\d+), failed requests 0",
        out,
    )
    assert found, out
    judged, unparsed = int(found.group(2)), int(found.group(3))
    assert judged + unparsed * (1 if mode == "pointwise" else 2) == 6
