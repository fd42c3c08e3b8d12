"""veRL's keys beyond the quickstart: each changes what it says (rewards, data, sampling, engines,
multi-turn, checkpoints, warm-up), checked at the smallest level that shows it."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from omegaconf import OmegaConf

import agentgym
from agentgym.config import ConfigError
from agentgym.trainer.config import load_config
from agentgym.types import Trajectory, Turn
from tests.support.compat_fixtures import gsm8k_rows, write_gsm8k_parquet


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    return write_gsm8k_parquet(tmp_path_factory.mktemp("gsm8k"))


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def reward_file(tmp_path, body: str):
    path = tmp_path / "my_reward.py"
    path.write_text(textwrap.dedent(body))
    return path


# ---- rewards -------------------------------------------------------------------------------------


def test_rows_are_scored_by_their_data_source(tmp_path):
    rows = gsm8k_rows(2, 0, "train")
    rows[1] = {**rows[1], "data_source": "HuggingFaceH4/MATH-500", "reward_model": {"ground_truth": "\\frac{1}{2}"}}
    env = agentgym.make("rows", data_files=str(write_jsonl(tmp_path / "t.jsonl", rows)))
    env.reset(options={"index": 0})
    truth = rows[0]["reward_model"]["ground_truth"]
    assert env.step(f"so #### {truth}")[4]["outcome_reward"] == 1.0
    env.reset(options={"index": 1})
    assert env.step("the answer is \\boxed{0.5}")[4]["outcome_reward"] == 1.0
    env.reset(options={"index": 1})
    assert env.step("#### 0.5")[4]["outcome_reward"] == 0.0  # MATH's rule reads \boxed{}, not ####


def test_custom_reward_function_replaces_the_rule(tmp_path):
    path = reward_file(
        tmp_path,
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if "dict" in solution_str:
                return {"score": 0.75, "acc": 1.0, "note": "text is dropped"}
            return 0.25 if extra_info["split"] == "train" and data_source == "openai/gsm8k" else -1.0
    """,
    )
    data = write_jsonl(tmp_path / "t.jsonl", gsm8k_rows(2, 0, "train"))
    env = agentgym.make("rows", data_files=str(data), custom_reward_function={"path": str(path)})
    env.reset(options={"index": 0})
    assert env.step("anything")[4]["outcome_reward"] == 0.25
    env.reset(options={"index": 1})
    info = env.step("a dict please")[4]
    assert info["outcome_reward"] == 0.75 and info["metrics"]["acc"] == 1.0 and "note" not in info["metrics"]
    with pytest.raises(ValueError, match="has no function 'score_it'"):
        agentgym.make("rows", data_files=str(data), custom_reward_function={"path": str(path), "name": "score_it"})


def test_a_data_source_without_a_rule_asks_for_a_reward_function(tmp_path):
    from agentgym.preflight import preflight

    rows = [{**r, "data_source": "my/own"} for r in gsm8k_rows(4, 0, "train")]
    data = write_jsonl(tmp_path / "t.jsonl", rows)
    cfg = load_config(
        overrides=[
            f"data.train_files={data}",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            f"trainer.default_local_dir={tmp_path / 'run'}",
        ],
        warn=False,
    )
    with pytest.raises(ConfigError, match="custom_reward_function.path"):
        preflight(cfg)
    path = reward_file(
        tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
    )
    cfg.custom_reward_function.path = str(path)
    plan = preflight(cfg)
    assert cfg.env.name == "rows" and "my/own" in plan.env_chosen
    assert cfg.env.kwargs.custom_reward_function.path == str(path)


def test_prime_scores_with_a_time_limit(tmp_path):
    from agentgym.preflight import rows_env_kwargs

    path = reward_file(
        tmp_path,
        """
        import time
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if "slow" in solution_str:
                time.sleep(30)
            return 1.0
    """,
    )
    data = write_jsonl(tmp_path / "t.jsonl", gsm8k_rows(1, 0, "train"))
    env = agentgym.make("rows", data_files=str(data), custom_reward_function={"path": str(path)}, score_timeout=2.0)
    env.reset(options={"index": 0})
    assert env.step("fast")[4]["outcome_reward"] == 1.0
    env.reset(options={"index": 0})
    info = env.step("slow")[4]
    assert info["outcome_reward"] == 0.0 and info["metrics"]["score_timeout"] == 1.0
    cfg = load_config(overrides=["reward_model.reward_manager=prime"], warn=False)
    assert rows_env_kwargs(cfg)["score_timeout"] == 300.0


def test_dapo_punishes_overlong_responses():
    import asyncio

    from agentgym.rewards import OverlongPenaltySource, reward_manager_source
    from agentgym.rollout.sources import FixedTrajectorySource

    cfg = load_config(
        env="first_letter",
        overrides=[
            "reward_model.reward_manager=dapo",
            "data.max_response_length=20",
            "+reward_model.reward_kwargs.overlong_buffer_cfg={enable: true, len: 8, penalty_factor: 1.0, log: true}",
        ],
        warn=False,
    )
    trajs = [
        Trajectory(turns=[Turn(prompt_ids=[1, 2], response_ids=[5] * n, logprobs=[-1.0] * n)], outcome_reward=1.0)
        for n in (10, 16, 20)
    ]
    source = reward_manager_source(cfg, FixedTrajectorySource([trajs]))
    assert isinstance(source, OverlongPenaltySource)
    out = asyncio.run(source.collect(1))
    # expected length 20 - 8 = 12: 10 tokens no penalty, 16 -> -(4/8), 20 -> -(8/8)
    assert [t.outcome_reward for t in out] == pytest.approx([1.0, 0.5, 0.0])
    assert out[2].metrics["overlong"] == 1.0
    assert reward_manager_source(load_config(env="first_letter", warn=False), "src") == "src"


# ---- data ------------------------------------------------------------------------------------------


def prepare(tmp_path, rows, *overrides):
    from agentgym.preflight import preflight

    data = write_jsonl(tmp_path / "train.jsonl", rows)
    cfg = load_config(
        overrides=[
            f"data.train_files={data}",
            "data.train_batch_size=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "data.max_prompt_length=150",
            f"trainer.default_local_dir={tmp_path / 'run'}",
            *overrides,
        ],
        warn=False,
    )
    return cfg, preflight(cfg)


def long_rows():
    rows = gsm8k_rows(3, 0, "train")
    rows[1] = {**rows[1], "prompt": [{"role": "user", "content": "start " + "filler word " * 60 + "the end"}]}
    return rows


def test_prompt_key_and_max_samples(tmp_path):
    rows = [
        {"question_prompt": r["prompt"], **{k: v for k, v in r.items() if k != "prompt"}}
        for r in gsm8k_rows(5, 0, "train")
    ]
    cfg, plan = prepare(
        tmp_path, rows, "data.prompt_key=question_prompt", "data.train_max_samples=3", "data.max_prompt_length=512"
    )
    assert plan.rows == 3 and cfg.env.name == "rows"
    env = agentgym.make("rows", data_files=cfg.data.train_files)
    assert env.num_tasks() == 3 and env.reset(options={"index": 0})[0] == rows[0]["question_prompt"]


def test_overlong_prompts_fail_drop_or_get_cut(tmp_path):
    from agentgym.model import load_tokenizer
    from agentgym.rollout.chat import ChatTokenizer

    with pytest.raises(ConfigError, match=r"1 of 3 train rows have prompts longer than data.max_prompt_length=150"):
        prepare(tmp_path, long_rows())
    _, plan = prepare(tmp_path, long_rows(), "data.filter_overlong_prompts=true")
    assert plan.rows == 2 and plan.prepared["train"].dropped == 1
    chat = ChatTokenizer(load_tokenizer("tiny"))
    for side, kept in (("left", "the end"), ("right", "start"), ("middle", None)):
        cfg, plan = prepare(tmp_path, long_rows(), f"data.truncation={side}")
        prompt = plan.prepared["train"].rows[1]["prompt"]
        assert len(chat.prompt_ids(prompt)) <= 150 and plan.rows == 3
        text = prompt[0]["content"]
        if kept:
            assert kept in text and ("start" not in text if side == "left" else "the end" not in text)
        else:
            assert text.startswith("start") and text.endswith("end")


def test_return_raw_chat_false_is_a_no_op_and_says_so(caplog):
    load_config(env="first_letter", overrides=["data.return_raw_chat=false"])
    assert any("return_raw_chat=false: no effect" in r.getMessage() for r in caplog.records)


# ---- sampling and engines --------------------------------------------------------------------------


def test_do_sample_false_decodes_greedily():
    from agentgym.rollout.sources import EnvRolloutSource

    cfg = load_config(
        env="first_letter",
        overrides=[
            "actor_rollout_ref.rollout.do_sample=false",
            "actor_rollout_ref.rollout.val_kwargs.temperature=0.7",
            "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        ],
        warn=False,
    )
    source = EnvRolloutSource(cfg, client=None, tokenizer="tiny")
    assert source.train_runner.config.temperature == 0.0
    assert source.val_runner.config.temperature == 0.7
    default = load_config(
        env="first_letter", overrides=["actor_rollout_ref.rollout.val_kwargs.temperature=0.7"], warn=False
    )
    assert default.actor_rollout_ref.rollout.val_kwargs.temperature == 0.0  # veRL: val do_sample=false by default


def test_engine_keys_reach_the_vllm_and_sglang_command_lines(monkeypatch):
    from agentgym.compat.engine_args import engine_server_kwargs
    from agentgym.server import launch
    from agentgym.server.launchers import sglang_command, vllm_command
    from agentgym.trainer.rollout_servers import RolloutServers

    overrides = [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.max_num_seqs=32",
        "actor_rollout_ref.rollout.max_num_batched_tokens=4096",
        "actor_rollout_ref.rollout.enable_chunked_prefill=false",
        "actor_rollout_ref.rollout.dtype=float16",
        "actor_rollout_ref.rollout.engine_kwargs.vllm={swap_space: 4, disable_log_requests: true}",
    ]
    cfg = load_config(env="first_letter", overrides=overrides, warn=False)
    kwargs = engine_server_kwargs(cfg)
    command = vllm_command("/m", **kwargs)
    assert command[command.index("--dtype") + 1] == "float16"
    for flag in ("--enforce-eager", "--no-enable-chunked-prefill", "--disable-log-requests"):
        assert flag in command
    assert command[command.index("--max-num-seqs") + 1] == "32" and command[command.index("--swap-space") + 1] == "4"
    assert "--load-format" not in command  # veRL's dummy: agentgym's servers start from the model's weights
    sglang = sglang_command(
        "/m",
        **engine_server_kwargs(
            load_config(
                env="first_letter",
                overrides=["actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.enforce_eager=true"],
                warn=False,
            )
        ),
    )
    assert "--disable-cuda-graph" in sglang and sglang[sglang.index("--max-running-requests") + 1] == "256"
    seen = {}

    class Handle:
        url, model = "http://x", "m"

        def stop(self):
            pass

    def fake_start(engine, model, port=0, **kw):
        seen.update(kw, engine=engine)
        return Handle()

    monkeypatch.setattr(launch, "start_policy_server", fake_start)
    RolloutServers(cfg)
    assert seen["engine"] == "vllm" and "--enforce-eager" in seen["extra_args"] and seen["dtype"] == "float16"


def test_chat_template_kwargs_reach_the_template():
    from agentgym.model import load_tokenizer
    from agentgym.rollout.chat import ChatTokenizer

    tok = load_tokenizer("tiny")
    templated = type(tok).from_pretrained(tok.name_or_path)
    templated.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and "
        "not enable_thinking %}<think></think>{% endif %}{% endif %}"
    )
    messages = [{"role": "user", "content": "hi"}]
    plain = ChatTokenizer(templated).render(messages, add_generation_prompt=True)
    thinking_off = ChatTokenizer(templated, template_kwargs={"enable_thinking": False}).render(
        messages, add_generation_prompt=True
    )
    assert plain == "<user>hi<assistant>" and thinking_off == "<user>hi<assistant><think></think>"


# ---- multi-turn ------------------------------------------------------------------------------------


def test_max_user_turns_bounds_the_episode():
    cfg = load_config(env="sokoban", overrides=["actor_rollout_ref.rollout.multi_turn.max_user_turns=1"], warn=False)
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 2
    cfg = load_config(env="sokoban", overrides=["actor_rollout_ref.rollout.multi_turn.max_user_turns=5"], warn=False)
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 3  # the preset's own limit is lower


def test_interaction_config_path_makes_interaction_episodes(tmp_path):
    from agentgym.preflight import preflight

    rows = [
        {
            **r,
            "extra_info": {
                **r["extra_info"],
                "interaction_kwargs": {
                    "name": "gsm8k",
                    "query": "q",
                    "ground_truth": r["reward_model"]["ground_truth"],
                },
            },
        }
        for r in gsm8k_rows(2, 0, "train")
    ]
    data = write_jsonl(tmp_path / "t.jsonl", rows)
    cfg = load_config(
        overrides=[
            f"data.train_files={data}",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.multi_turn.interaction_config_path=configs/interaction/gsm8k.yaml",
            f"trainer.default_local_dir={tmp_path / 'run'}",
        ],
        warn=False,
    )
    preflight(cfg)
    assert cfg.env.name == "gsm8k_interaction"
    env = agentgym.make(cfg.env.name, data_files=str(data), **OmegaConf.to_container(cfg.env.kwargs))
    messages, info = env.reset(options={"index": 0})
    assert info["interaction"] == "gsm8k" and messages[0]["role"] == "user"  # the row's prompt, no added system


def test_tool_agent_rows_get_a_tool_loop(tmp_path):
    rows = gsm8k_rows(2, 0, "train")
    rows[1]["agent_name"] = "tool_agent"
    env = agentgym.make("rows", data_files=str(write_jsonl(tmp_path / "t.jsonl", rows)))
    _, info = env.reset(options={"index": 0})
    assert "tools" not in info
    assert env.step("#### 1")[2] is True  # single turn
    _, info = env.reset(options={"index": 1})
    assert {t["function"]["name"] for t in info["tools"]} == {"calculator", "python"}
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    observation, _, terminated, _, _ = env.step(call)
    assert not terminated and observation[0]["role"] == "tool" and "5" in observation[0]["content"]
    truth = rows[1]["reward_model"]["ground_truth"]
    _, _, terminated, _, info = env.step(f"#### {truth}")
    assert terminated and info["outcome_reward"] == 1.0 and info["metrics"]["tool_calls"] >= 1


# ---- training loop keys ------------------------------------------------------------------------------


def small_run(gsm8k, run_dir, *extra):
    from agentgym.cli import main

    return main(
        [
            "train",
            f"data.train_files={gsm8k}/train.parquet",
            f"data.val_files={gsm8k}/test.parquet",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "data.max_response_length=8",
            "trainer.use_ray=false",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "data.val_batch_size=4",
            f"trainer.default_local_dir={run_dir}",
            *extra,
        ]
    )


def metric_rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_val_only_validates_and_stops(gsm8k, tmp_path):
    assert small_run(gsm8k, tmp_path, "trainer.val_only=true") == 0
    rows = metric_rows(tmp_path)
    assert len(rows) == 1 and rows[0]["step"] == 0 and rows[0]["val/episodes"] == 4
    assert not list(tmp_path.glob("global_step_*"))


def test_critic_warmup_trains_only_the_critic_first(gsm8k, tmp_path):
    assert (
        small_run(
            gsm8k,
            tmp_path,
            "trainer.critic_warmup=2",
            "trainer.save_freq=1",
            "actor_rollout_ref.actor.checkpoint.save_contents=[model]",
        )
        == 0
    )
    rows = [r for r in metric_rows(tmp_path) if "critic/vf_loss" in r]
    assert ["actor/pg_loss" in r for r in rows] == [False, True]
    first = torch.load(tmp_path / "global_step_1" / "actor" / "model.pt")
    from agentgym.model import load_causal_lm

    initial = load_causal_lm("tiny").state_dict()
    assert all(torch.equal(first[k], initial[k]) for k in first)  # step 1 did not move the actor
    assert not (tmp_path / "global_step_1" / "actor" / "optim.pt").exists()  # save_contents=[model]
    assert (tmp_path / "global_step_1" / "critic" / "optim.pt").exists()


def test_checkpoint_load_contents_picks_the_parts(tmp_path):
    from agentgym.trainer.train_state import TrainState

    optim = load_config(overrides=["actor_rollout_ref.actor.optim.lr=0.1"], warn=False).actor_rollout_ref.actor.optim

    def state():
        torch.manual_seed(0)
        module = torch.nn.Linear(2, 2)
        return TrainState(module, optim, 10, "dp", 1, "cpu")

    saved = state()
    saved.module(torch.ones(1, 2)).sum().backward()
    saved.step(None)
    saved.save(tmp_path, 0, ["model", "optimizer"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt", "optim.pt"]
    fresh = state()
    fresh.load(tmp_path, 0, ["model"])
    assert torch.equal(fresh.module.weight, saved.module.weight) and not fresh.optimizer.state
    with pytest.raises(FileNotFoundError, match="load_contents"):
        state().load(tmp_path, 0, ["model", "extra"])


# ---- algorithm keys --------------------------------------------------------------------------------


def test_token_sum_aggregation_sums_over_the_global_batch():
    from agentgym.trainer import algos

    loss = torch.tensor([[1.0, 2.0, 5.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.float32)
    assert float(algos.agg_loss(loss, mask, "token-sum")) == 6.0
    assert float(algos.agg_loss(loss, mask, "token-sum", dp_size=2)) == 12.0  # ranks average: the global sum
    assert (
        load_config(
            env="first_letter", overrides=["actor_rollout_ref.actor.loss_agg_mode=token-sum"], warn=False
        ).actor_rollout_ref.actor.loss_agg_mode
        == "token-sum"
    )


def test_gspo_says_which_aggregation_its_policy_loss_uses(caplog):
    load_config(env="first_letter", overrides=["actor_rollout_ref.actor.policy_loss.loss_mode=gspo"])
    assert any("seq-mean-token-mean whatever" in r.getMessage() for r in caplog.records)
    caplog.clear()
    load_config(env="first_letter", overrides=["algorithm=gspo"])
    assert not any("gspo" in r.getMessage() for r in caplog.records)


def test_offload_keys_warn_without_a_gpu_and_shard_with_cpu_offload_on_one(monkeypatch, caplog):
    from agentgym.trainer import train_state

    if not torch.cuda.is_available():
        load_config(env="first_letter", overrides=["actor_rollout_ref.actor.fsdp_config.param_offload=true"])
        assert any("no effect without a GPU" in r.getMessage() for r in caplog.records)
    seen = []
    monkeypatch.setattr("torch.distributed.fsdp.fully_shard", lambda module, **kw: seen.append(kw))
    module = torch.nn.Sequential(torch.nn.Linear(2, 2))
    offload = ["actor_rollout_ref.actor.fsdp_config.param_offload=true"]
    fsdp_config = load_config(overrides=offload, warn=False).actor_rollout_ref.actor.fsdp_config
    train_state.shard(module, fsdp_config, "cuda", ["Linear"])
    assert seen and all(type(kw["offload_policy"]).__name__ == "CPUOffloadPolicy" for kw in seen)
    seen.clear()
    train_state.shard(module, fsdp_config, "cpu", ["Linear"])
    assert all("offload_policy" not in kw for kw in seen)
