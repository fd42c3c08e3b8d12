"""``agentgym train``'s configuration: every key a run may set, its type, default and meaning.

Key names follow veRL's ``ppo_trainer.yaml`` where the concept is the same, and a key veRL defines takes
veRL's default, so a veRL command does what veRL would do. ``configs/train.yaml`` is written from this
module (``python -m agentgym.config_schema``); edit here, not there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agentgym.config_schema.fields import section, setting
from agentgym.config_schema.policy import ActorRolloutRefConfig, CriticConfig

HEADER = """\
agentgym training config. Key names follow veRL's ppo_trainer.yaml where the concept is
the same, and a key veRL defines takes veRL's default, so a veRL command does what veRL
would do (`agentgym train` instead of `python3 -m verl.trainer.main_ppo`). The few
defaults that differ only trade memory for speed or name places; they are listed, with the
reason, in docs/coming_from_verl.md. agentgym's own entry points choose their own settings
explicitly: `--env NAME` composes configs/env/NAME.yaml (GRPO, n>1, small batches) and
`--agent` configs/env/agent.yaml.

Every key a run may set is listed here: a key that is not here is a typo (agentgym names the
closest valid key), a key of another system agentgym refuses (the message says why and what
to use), or one it accepts with no effect (a warning says so).

Compose order (later wins): this file, then the group files chosen in `defaults`
(configs/<group>/<choice>.yaml; an env file may choose groups of its own), then
`--config FILE`, then command-line overrides.
  agentgym train --env sokoban                         # env group: configs/env/sokoban.yaml
  agentgym train --env sokoban algorithm=ppo           # pick a group file
  agentgym train --env sokoban data.train_batch_size=8 algorithm.adv_estimator=grpo
  agentgym train --env sokoban +env.kwargs.max_steps=20  # `+` adds a key this file lacks
`agentgym config --show [--env NAME] [KEY=VALUE ...]` prints a composed config with each value's origin."""


@dataclass
class GroupDefaults:
    """The group file each group starts from (``defaults:`` at the top of ``train.yaml``)."""

    algorithm: str | None = setting(None, "configs/algorithm/<name>.yaml (env presets choose grpo)")
    model: str | None = setting(None, "configs/model/<name>.yaml (env presets choose tiny: its learning rate)")
    server: str | None = setting("embedded", "configs/server/<name>.yaml")
    env: str | None = setting(None, "`--env NAME` picks configs/env/NAME.yaml, else generic with env.name=NAME")


# ---- env, data -----------------------------------------------------------------------------


@dataclass
class EnvConfig:
    name: str | None = setting(
        None, "a registered env (`agentgym envs`); null with data.train_files: chosen from the rows"
    )
    kwargs: dict[str, Any] = setting({}, "constructor arguments: agentgym.make(env.name, **env.kwargs)")
    val_kwargs: dict[str, Any] = setting({}, "extra constructor arguments for the validation env (e.g. {split: test})")
    train_seed_start: int = setting(0, "generated envs: training task k is seed train_seed_start + k")
    val_seed_start: int = setting(1000000, "validation tasks are seeds from here (never trained on)")
    num_val_tasks: int = setting(16, "validation tasks per evaluation (dataset envs: at most the val set)")
    executor: Literal["thread", "process", "inline", "openenv", "workers", "ray"] = setting(
        "thread",
        "where env calls run: thread | process | inline (cheap pure-Python envs) | openenv (envs in OpenEnv "
        "servers at env.urls); or where whole episodes run: workers (worker processes) | ray (Ray actors). "
        "See agentgym/rollout/executors.py",
    )
    workers: int | None = setting(None, "process / workers / ray: how many (null: CPUs)")
    worker_executor: Literal["thread", "inline"] = setting(
        "thread", "workers / ray: env calls inside each worker: thread (timeouts hold) | inline"
    )
    urls: list[str] = setting([], "openenv: env servers (`agentgym env-serve --env NAME --port P`)")
    timeout: float = setting(60.0, "seconds per env reset/step (not inline)")
    custom_envs: dict[str, Any] = setting(
        {},
        "several envs in one run (ROLL's env managers): tag -> {env: NAME, kwargs: {...}}; metrics are kept per tag",
    )
    tags: list[str] = setting([], "custom_envs: the tags trained on")
    n_groups: list[int] = setting([], "custom_envs: each tag's groups per step (its share of data.train_batch_size)")
    val_tags: list[str] = setting([], "custom_envs: the tags validated on")
    val_n_groups: list[int] = setting([], "custom_envs: each validation tag's groups per validation")
    max_traj_per_env: int = setting(-1, "ROLL: most trajectories one env instance rolls out per step (-1: as needed)")


@dataclass
class DataConfig:
    train_batch_size: int = setting(
        1024, "tasks (prompts) per step; the batch holds train_batch_size * rollout.n trajectories"
    )
    gen_batch_size: int | None = setting(
        None, "algorithm.filter_groups: tasks per rollout round (null: train_batch_size)"
    )
    val_batch_size: int | None = setting(
        None, "tasks per validation run (null: every row of val_files, as veRL; else env.num_val_tasks)"
    )
    max_prompt_length: int = setting(
        512, "tokens before the first sampled token; longer trajectories are not trained on"
    )
    max_response_length: int = setting(512, "tokens from the first sampled token to the end, every turn included")
    train_files: Any = setting(
        None, "dataset rows (.parquet/.jsonl, veRL format; a file or a list); the env's data_files"
    )
    val_files: Any = setting(None, "the validation env's data_files")
    train_max_samples: int = setting(-1, "use only the first N rows of train_files (-1: all)")
    val_max_samples: int = setting(-1, "use only the first N rows of val_files (-1: all)")
    shuffle: bool = setting(True, "shuffle the task order each epoch (seeded by trainer.seed)")
    prompt_key: str = setting("prompt", "the column holding the chat prompt")
    reward_fn_key: str = setting(
        "data_source", "the column that picks the reward function (veRL's default_compute_score)"
    )
    return_raw_chat: bool = setting(True, "always on here: prompts are rendered from the chat messages")
    filter_overlong_prompts: bool = setting(False, "drop rows whose rendered prompt is longer than max_prompt_length")
    truncation: Literal["error", "left", "right", "middle"] = setting(
        "error", "rows longer than max_prompt_length: error | left | right | middle"
    )
    apply_chat_template_kwargs: dict[str, Any] = setting(
        {}, "extra chat-template variables (e.g. {enable_thinking: false})"
    )


# ---- rewards ------------------------------------------------------------------------------------


@dataclass
class RewardModelModelConfig:
    path: str | None = setting(
        None, "an AutoModelForSequenceClassification directory (num_labels=1); its logit at the last token"
    )
    input_tokenizer: str | None = setting(
        "${actor_rollout_ref.model.path}",
        "decode replies with this and re-render the chat with the RM's template (veRL's default); null: "
        "score the policy's tokens as sampled (same template)",
    )


@dataclass
class RewardModelConfig:
    enable: bool = setting(False, "score each trajectory with a reward model, veRL's RM (docs/rewards.md)")
    reward_manager: Literal["naive", "dapo", "prime"] = setting(
        "naive", "naive | dapo | prime: how the rule-based reward scores a batch"
    )
    reward_kwargs: dict[str, Any] = setting(
        {}, "dapo: {overlong_buffer_cfg: {enable, len, penalty_factor, log}, max_resp_len}"
    )
    model: RewardModelModelConfig = section(RewardModelModelConfig, "the reward model")
    micro_batch_size_per_gpu: int | None = setting(None, "rows per reward-model forward (null: 8)")
    micro_batch_size: int | None = setting(
        None, "veRL's deprecated global size: used when micro_batch_size_per_gpu is null"
    )
    max_length: int | None = setting(
        None, "longer rows keep their first max_length tokens (veRL truncates on the right); null: no limit"
    )
    combine: Literal["replace", "add"] = setting(
        "replace", "replace: the RM's score is the reward (veRL) | add: the env's reward + the RM's score"
    )


@dataclass
class JudgeConfig:
    enable: bool = setting(False, "score each trajectory with the judge")
    mode: Literal["pointwise", "group"] = setting(
        "pointwise",
        "pointwise: each trajectory alone | group: the n trajectories of a task against each other (RULER)",
    )
    base_url: str | None = setting(
        None, "e.g. http://127.0.0.1:8000/v1 (agentgym serve, vLLM) or a hosted API's /v1 URL"
    )
    api_key_env: str | None = setting(
        None, "the environment variable holding the endpoint's key (sent as Authorization: Bearer)"
    )
    model: str | None = setting(None, "the model name to ask for (null: the first of the endpoint's /v1/models)")
    prompt_template: str | None = setting(
        None, "a file with the prompt (null: the built-in one of the mode); see docs/rewards.md for fields"
    )
    score_range: list[float] = setting(
        [0, 10], "pointwise: the scale the judge answers in; scores are mapped to [0, 1]"
    )
    temperature: float = setting(0.0, "the judge's sampling temperature")
    max_tokens: int = setting(512, "most tokens of a judge's answer")
    concurrency: int = setting(8, "judge requests in flight at once")
    timeout: float = setting(60.0, "seconds per request")
    max_retries: int = setting(3, "retries of a request that timed out, could not connect, or got 429 / 5xx")
    cache: bool = setting(
        True, "remember scores by content hash in <run dir>/judge_cache.jsonl (a resumed run pays once)"
    )
    combine: Literal["replace", "add"] = setting(
        "replace", "replace: the judge's score is the reward | add: the env's reward + the judge's score"
    )


@dataclass
class TeacherConfig:
    path: str | None = setting(
        None, "a model directory (or tiny) scored in a worker of its own (this process, or a Ray actor)"
    )
    server_urls: list[str] = setting(
        [], "or running servers that return prompt logprobs (vllm | sglang), instead of path"
    )
    backend: Literal["vllm", "sglang"] = setting(
        "vllm", "the API of server_urls: vllm (prompt_logprobs) | sglang (input_token_logprobs)"
    )
    model: str | None = setting(None, "the served model name (null: the server's first)")
    tokenizer: str | None = setting(
        None, "the teacher's tokenizer, checked against the student's (null: path; needed with server_urls)"
    )
    micro_batch_size_per_gpu: int = setting(8, "sequences per teacher forward (path)")
    concurrency: int = setting(8, "requests in flight (server_urls)")
    timeout: float = setting(120.0, "seconds per request (server_urls)")
    max_retries: int = setting(3, "retries of a failed request (server_urls)")


@dataclass
class DistillationConfig:
    enable: bool = setting(False, "advantage of each sampled token += kl_coef * (teacher logprob - student logprob)")
    kl_coef: float = setting(1.0, "weight of the per-token reverse KL (prime-rl's teacher_tau)")
    env_coef: float = setting(1.0, "weight of the env's advantage beside it (0: pure distillation)")
    clip: float | None = setting(
        None, "clip each token's reverse KL to [-clip, clip] before it enters the advantage (null: none)"
    )
    loss_mode: Literal["sampled", "topk"] = setting(
        "sampled",
        "sampled: the reverse KL of the sampled token in the advantage | topk: the reverse KL over the teacher's "
        "top-k tokens (and a tail bucket) from the student's logits, added to the actor loss",
    )
    topk: int = setting(
        20, "the teacher's k most likely tokens returned per scored position (topk's support; 0 with sampled: none)"
    )
    beta: float = setting(
        1.0,
        "topk: which divergence, TRL GKD's beta (generalized Jensen-Shannon): 1 reverse KL(student || teacher), "
        "0 forward KL(teacher || student), between: JSD with the mixture beta*teacher + (1-beta)*student",
    )
    action_tag: str | None = setting(
        "answer", "distill/*_action metrics: tokens inside <tag>...</tag> of a reply (null: no split)"
    )
    teacher: TeacherConfig = section(TeacherConfig, "the teacher model")


@dataclass
class CustomRewardFunctionConfig:
    path: str | None = setting(None, "the Python file (null: the env's own reward)")
    name: str = setting("compute_score", "the function's name in it")


# ---- algorithm ----------------------------------------------------------------------------------


@dataclass
class GigpoConfig:
    step_advantage_w: float = setting(1.0, "weight of a turn's return against the turns of its group in the same state")
    episode_advantage_w: float = setting(1.0, "weight of the episode's score against its group (GRPO's advantage)")
    mode: str = setting("mean_std_norm", "mean_std_norm | mean_norm: how a score is compared with its group's")
    step_grouping: str = setting(
        "state", "state (GiGPO: equal Turn.state_key) | turn (episodes that reached the same turn)"
    )


@dataclass
class FilterGroupsConfig:
    enable: bool = setting(False, "keep sampling tasks until data.train_batch_size groups have a spread (or the cap)")
    metric: str = setting("score", "score (the trajectory's reward as trained: turn + outcome) | acc (success)")
    max_num_gen_batches: int = setting(
        4,
        "most rollout rounds of data.gen_batch_size tasks per step (<= 0: no cap); at the cap the step trains "
        "on the groups it has (batch/kept_groups says how many)",
    )


@dataclass
class KlCtrlConfig:
    type: Literal["fixed", "adaptive"] = setting("fixed", "fixed | adaptive")
    kl_coef: float = setting(0.001, "use_kl_in_reward: the KL penalty's (initial) weight")
    target_kl: float = setting(0.1, "adaptive: the KL the weight is steered towards")
    horizon: int = setting(10000, "adaptive: how many samples the weight's adjustment is spread over")


@dataclass
class RolloutCorrectionConfig:
    rollout_is: str | None = setting(
        None,
        "null: none (with use_rollout_log_probs, PPO clips against the behaviour policy) | token | sequence: "
        "decoupled PPO with truncated importance weights pi_old / pi_behav",
    )
    rollout_is_threshold: float = setting(2.0, "truncation: weights above it are clipped to it")
    rollout_is_batch_normalize: bool = setting(False, "rescale the truncated weights to mean 1 over the batch")


@dataclass
class RewardNormalizationConfig:
    grouping: Literal["state", "batch", "inductive"] = setting(
        "state", "state (the task's group) | batch | inductive (the env tag)"
    )
    method: Literal["identity", "mean", "mean_std", "asym_clip"] = setting(
        "identity", "identity | mean | mean_std | asym_clip (mean_std clipped to [-1, 3])"
    )


@dataclass
class AlgorithmConfig:
    adv_estimator: str = setting(
        "gae",
        "gae | grpo | gigpo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline | remax (greedy "
        "baseline episode per task) | opo | grpo_passk | gpg | reinforce",
    )
    gamma: float = setting(1.0, "gae, and gigpo's discount of turn returns")
    lam: float = setting(1.0, "gae's lambda (bias against variance of the advantage)")
    norm_adv_by_std_in_grpo: bool = setting(True, "grpo: divide each advantage by its group's score std")
    gigpo: GigpoConfig = section(
        GigpoConfig, "adv_estimator=gigpo: turn-level credit (verl-agent's keys; agentgym/trainer/algos/turn_credit.py)"
    )
    filter_groups: FilterGroupsConfig = section(
        FilterGroupsConfig, "DAPO's dynamic sampling (veRL's keys): train only on groups whose scores differ"
    )
    use_kl_in_reward: bool = setting(False, "subtract a KL penalty to the reference policy from the reward")
    kl_penalty: str = setting("kl", "the estimator for KL in the reward")
    kl_ctrl: KlCtrlConfig = section(KlCtrlConfig, "use_kl_in_reward: the penalty's weight")
    turn_reward_coef: float = setting(
        1.0,
        "turn-level credit: token reward = turn_reward_coef * (each turn's env reward, on that turn's last "
        "sampled token) + outcome_reward_coef * (the episode's outcome reward, on its last sampled token); "
        "see Trajectory.token_rewards",
    )
    outcome_reward_coef: float = setting(1.0, "the outcome reward's weight in the token rewards (turn_reward_coef)")
    turn_reward_from: str | None = setting(
        None,
        "a per-turn fact the env reports (Turn.metrics key, e.g. sokoban's format_reward) used as each turn's "
        "reward in training instead of the env's step reward (agentgym/rewards/turn_facts.py)",
    )
    rollout_correction: RolloutCorrectionConfig = section(
        RolloutCorrectionConfig,
        "off-policy correction with the servers' logprobs (veRL's names; docs/async_training.md)",
    )
    reward_normalization: RewardNormalizationConfig = section(
        RewardNormalizationConfig,
        "ROLL's reward shaping, applied to each trajectory's reward before the advantage estimator",
    )
    reward_norm: Literal["batch", "group", "running"] | None = setting(
        None, "null | batch | group | running: normalise rewards (ROLL's reward_norm)"
    )
    reward_shift: bool = setting(False, "reward_norm: subtract the mean only")
    reward_scale: bool = setting(False, "reward_norm=running: divide by the std only")
    reward_clip: float | None = setting(None, "clip rewards to [-reward_clip, reward_clip]")
    whiten_advantages: bool = setting(False, "whiten the advantages over the batch")
    advantage_clip: float | None = setting(None, "clip advantages to [-advantage_clip, advantage_clip]")


# ---- the run --------------------------------------------------------------------------------------


@dataclass
class TrainerSettings:
    project_name: str = setting("agentgym", "the project the run belongs to (run directory, loggers)")
    experiment_name: str | None = setting(None, "null: <env or agent>-<adv_estimator>")
    total_epochs: int = setting(30, "dataset envs: passes over data.train_files")
    total_training_steps: int | None = setting(None, "wins over total_epochs; generated envs need it")
    total_training_minutes: float | None = setting(None, "also stop after the step that ends past it (null: none)")
    logger: list[str] = setting(
        ["console", "jsonl"], "console | jsonl | tensorboard | wandb (metrics.jsonl is always written)"
    )
    log_samples: int = setting(4, "trajectories saved per step to <run dir>/samples.jsonl (0: none)")
    save_freq: int = setting(-1, "steps between checkpoints, and the last step (-1: none, as in veRL)")
    test_freq: int = setting(-1, "steps between validations, and the last step (-1: none but val_before_train)")
    val_before_train: bool = setting(True, "validate once before the first step")
    val_only: bool = setting(False, "validate once and stop (no training)")
    critic_warmup: int = setting(0, "steps that train only the critic before the actor starts")
    resume_mode: Literal["auto", "disable", "resume_path"] = setting("auto", "auto | disable | resume_path")
    resume_from_path: str | None = setting(None, "resume_mode=resume_path: a global_step_N directory")
    default_local_dir: str | None = setting(
        None, "checkpoints, logs, final model (null: outputs/<project_name>/<experiment_name>)"
    )
    save_hf_model: bool = setting(True, "write the final policy as a Hugging Face directory (<dir>/huggingface)")
    max_actor_ckpt_to_keep: int | None = setting(None, "keep only the newest N checkpoints (null: all)")
    max_critic_ckpt_to_keep: int | None = setting(
        None, "checkpoints hold actor and critic together: the smaller of the two wins"
    )
    n_gpus_per_node: int = setting(1, "data-parallel workers per node (on CPU: worker processes); veRL: 8")
    nnodes: int = setting(1, "nodes of the training pool (Ray)")
    placement_strategy: Literal["auto", "PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = setting(
        "auto",
        "Ray placement group strategy of the trainer pool (auto: STRICT_PACK on one node, STRICT_SPREAD "
        "with one worker per node, else PACK)",
    )
    device: Literal["auto", "cpu", "cuda"] = setting("auto", "auto | cpu | cuda")
    cpu_threads_per_worker: int | None = setting(None, "torch threads in each CPU worker (null: cores / workers)")
    seed: int = setting(0, "seeds the task order, the model's initialisation and the sampling")
    use_ray: bool = setting(True, "false: run the workers in this process (one worker; fast tests)")
    step_wise_training: bool = setting(
        False,
        "one training sample per assistant turn (its whole prompt, its reply), the episode's advantage on each "
        "(SkyRL's name); false: one per episode, or per token sequence where a context policy or an agent "
        "rewrote the context. docs/long_horizon.md",
    )
    max_failed_episode_frac: float = setting(
        0.5,
        "a step where more of its episodes failed (after the client's retries) stops the run, exit 1",
    )
    shutdown_timeout: float = setting(
        10.0,
        "seconds agentgym train waits at exit for threads it started (a hung env step) before leaving them",
    )


@dataclass
class WarmStartConfig:
    enable: bool = setting(False, "the sokoban preset turns it on")
    demos: int = setting(10000, "expert episodes (agentgym demos), on seeds demo_seed_start ..")
    demo_seed_start: int = setting(2000000, "disjoint from RL's (env.train_seed_start ..) and the held-out seeds")
    demos_file: str | None = setting(None, "or a JSONL of chat conversations of your own (then no demos are written)")
    sft: dict[str, Any] = setting({}, "configs/sft.yaml keys for the SFT stage, e.g. {optim: {lr: 3.0e-3}}")


@dataclass
class HeldOutConfig:
    enable: bool = setting(False, "the sokoban preset turns it on")
    num_tasks: int = setting(200, "seeds env.val_seed_start .. + num_tasks - 1 (checked: never trained on)")
    temperatures: list[float] = setting([0.0, 1.0], "greedy (the judged figure) and sampled beside it")
    random_policy: bool = setting(True, "a row for the env's random_action() (envs that have one)")


@dataclass
class RolloutPoolConfig:
    nnodes: int = setting(1, "nodes of the pool (Ray): servers are spread over them")
    n_gpus_per_node: int = setting(
        1, "devices per node (on CPU: slots); holds rollout.num_servers * tensor parallel size"
    )


@dataclass
class CheckpointEngineConfig:
    enable: bool = setting(False, "copy the weights at a push and keep training while the servers load them")
    device_buffer_size_M: int = setting(
        4096, "weights travel to servers on other nodes in buckets of at most this many MB"
    )


@dataclass
class AsyncTrainingConfig:
    staleness_threshold: float = setting(
        0.0, "s: tasks started per weight version <= (1 + s) * samples per sync; lag <= ceil((1+s)K) - 1"
    )
    trigger_parameter_sync_step: int = setting(1, "K: trainer updates per weight push to the rollout side")
    require_batches: int = setting(
        1, "batches (data.train_batch_size tasks each) the trainer takes from the DataPool at once"
    )
    partial_rollout: bool = setting(False, "at a push, abort running generations and continue them on the new weights")
    use_rollout_log_probs: bool = setting(
        False, "the servers' logprobs are the behaviour policy's (actor.use_rollout_log_probs follows)"
    )
    max_queue_size: int | None = setting(
        None, "complete groups waiting in the DataPool before the rollout side stops starting tasks"
    )
    checkpoint_engine: CheckpointEngineConfig = section(CheckpointEngineConfig, "weight pushes that overlap training")


@dataclass
class RayInitConfig:
    address: str | None = setting(None, "null: start a local cluster; 'auto' or host:port joins an existing one")
    num_cpus: int | None = setting(None, "CPUs of a local cluster (null: all)")
    include_dashboard: bool = setting(False, "start Ray's dashboard")
    timeline_json_file: str | None = setting(
        None, "write Ray's timeline (chrome://tracing JSON) here at the end of the run"
    )


@dataclass
class TrainConfig:
    """``agentgym train``'s whole configuration (``configs/train.yaml``)."""

    env: EnvConfig = section(EnvConfig, "the environment the policy is trained on")
    data: DataConfig = section(DataConfig, "tasks per step, lengths, dataset files")
    actor_rollout_ref: ActorRolloutRefConfig = section(
        ActorRolloutRefConfig, "the policy: its model, training (actor), reference and servers (rollout)"
    )
    critic: CriticConfig = section(CriticConfig, "the value model (gae)")
    reward_model: RewardModelConfig = section(RewardModelConfig, "veRL's reward model and reward manager")
    judge: JudgeConfig = section(
        JudgeConfig,
        "agentgym: an LLM judge on any OpenAI-compatible endpoint scores each trajectory (docs/rewards.md)",
    )
    distillation: DistillationConfig = section(
        DistillationConfig, "agentgym: on-policy distillation, a teacher scores every token the student samples"
    )
    custom_reward_function: CustomRewardFunctionConfig = section(
        CustomRewardFunctionConfig,
        "a Python file with compute_score(data_source, solution_str, ground_truth, extra_info)",
    )
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "advantages, KL, reward shaping")
    trainer: TrainerSettings = section(TrainerSettings, "the run: steps, logging, checkpoints, workers")
    warm_start: WarmStartConfig = section(
        WarmStartConfig,
        "agentgym: expert demos -> SFT before RL (agentgym/stages/warm_start.py); cached under <run dir>/warm_start",
    )
    held_out: HeldOutConfig = section(
        HeldOutConfig, "agentgym: the before/after table at the end of the run (stages/held_out.py)"
    )
    rollout: RolloutPoolConfig = section(
        RolloutPoolConfig, "the rollout pool (policy servers) when actor_rollout_ref.hybrid_engine=false"
    )
    async_training: AsyncTrainingConfig = section(
        AsyncTrainingConfig,
        "the asynchronous trainer (docs/async_training.md); these defaults are the synchronous trainer "
        "exactly: configs/async_ppo_trainer.yaml sets async ones",
    )
    ray_init: RayInitConfig = section(
        RayInitConfig, "passed to ray.init (any ray.init keyword may be added here)", open=True
    )
