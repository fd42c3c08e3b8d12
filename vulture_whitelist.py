# ruff: noqa
"""Names vulture reports as unused that are used, by a caller it cannot see.

`vulture agentgym vulture_whitelist.py --min-confidence 60` (scripts/test.sh) passes when every
other definition in agentgym/ is used. A name goes here only with the reason it is live; a
function nothing calls is deleted, not listed.
"""

# ---- entry points (pyproject.toml: agentgym.envs / agentgym.interactions / agentgym.tools / families)
ArithmeticEnv
FirstLetterEnv
Gsm8kEnv
Gsm8kToolEnv
ToolTaskEnv
WorkspaceEnv
RowsEnv
OpenEnvClientEnv
CalculatorTool
PythonTool
Gsm8kInteraction
GSM8K_INTERACTION
FROZENLAKE_4X4
FROZENLAKE_4X4_SLIPPERY
FROZENLAKE_8X8
FROZENLAKE_8X8_SLIPPERY
SOKOBAN_6X6_1
SOKOBAN_6X6_2
SOKOBAN_8X8_2
SOKOBAN_10X10_3
gsm8k_reward  # agentgym.reward_fns
FAMILY  # envs/adapters/*: env families, entry points `family/* = module:FAMILY`
HarborEnv  # envs/workspace/suite_envs.py: entry points harbor, swebench, terminal/*, swe/*
SweBenchEnv
TERMINAL_FAMILY
SWE_FAMILY

# ---- the gymnasium API (envs/base.py: Space subclasses and Env attributes gymnasium reads)
_.is_np_flattenable
_.contains
probability  # Space.sample's signature
action_space

# ---- Hugging Face interfaces agentgym implements (server/kv_cache.py: a transformers Cache; model/)
_.is_compileable
_.get_seq_length
_.get_mask_sizes
query_length  # Cache.get_mask_sizes' signature
_.is_sliding
local_metadata  # torch's state-dict hook signature (model/lora.py)
_.base_model_name_or_path  # written into peft's adapter config
_.normalizer  # tokenizers' backend tokenizer (model/tiny.py)
_.pre_tokenizer

# ---- callbacks of other libraries
_.on_header  # httptools' parser callbacks (client/http11.py)
_.on_headers_complete
_.on_body
_.should_exit  # uvicorn.Server's stop flag (gateway/serve.py, server/handles.py)
refresh  # tqdm's set_postfix signature (progress.py)
# verifiers' Client interface (envs/adapters/verifiers.py), called by verifiers' rollouts
_.setup_client
_.to_native_tool
_.to_native_prompt
_.get_native_response
_.raise_from_native_response
_.from_native_response
_.get_response
sampling_args
# vLLM loads this class into its workers (`--worker-extension-cls`) and calls it through collective_rpc
VLLMWorkerWeights
_.agentgym_load_weights

# ---- FastAPI routes and exception handlers (registered by decorators)
listing
root_v1
doubled_v1
update_from_tensor
update_from_ipc
_api_error
_invalid
_internal

# ---- pydantic models: fields of the OpenAI spec that are parsed but not read, and validators
structured_outputs
guided_json
guided_regex
guided_choice
guided_grammar
echo
completion_tokens
prompt_token_ids
text_offset
owned_by
tool_call_id
_._bias
_._stop_list
_._seed_range
_._roles
_._tool_choice
_._top_logprobs_needs_logprobs
_._non_empty
_._no_echo
_._constrained
_._int_version
_._int_is_a_number
_._one_stop
# the Anthropic Messages models (agentgym/server/anthropic_types.py)
_._text_blocks
_._known_blocks
_._client_tool
_._no_thinking
_._system_text
_._stops
thinking
input_tokens
# the Responses API (server/responses_types.py): fields of openai.types.responses a client reads
_._items
annotations
reasoning_tokens
input_tokens_details
output_tokens
output_tokens_details
created_at
incomplete_details
_.incomplete_details

# ---- Ray actor methods, called by name through worker groups (trainer/workers.py)
_.rendezvous_address
_.init_distributed
_.needs_process_group
_.init_model
_.compute_log_prob
_.compute_ref_log_prob
_.update_actor
_.update_sft
_.weight_handles
_.push_weights
_.weight_buckets  # PolicyWorker, called by name from WeightSync._fetch_buckets and benchmarks/weight_sync.py
_.compute_values
_.update_critic
_._pushed  # keeps the pushed tensors alive until the next push (their memory is shared by handle)

# ---- registered by decorator, or read by name
compute_policy_loss_topr  # @_register_policy_loss("topr")
_.sampling_metrics  # read with getattr by ppo_trainer (sampling/* metrics)
_.warmup_style  # the optimizer config key train_state reads
__getattr__  # server/__init__.py: the lazy names
calculate_expression  # envs/tools/mcp/calculator_server.py: an MCP tool, @server.tool(name="calculate")

# ---- public API that users call and tests pin (no caller inside agentgym)
FixedTrajectorySource  # tests and users hand the trainer fixed trajectories
_.sampled_versions
_.to_json
_.from_json
_.delete_session
_.pop_complete
_.last_output  # the verifiers env's last rollout output, for inspection
_.cached_tokens  # per-sequence prefix-cache hits (tests/server/test_engine_cache.py)
cached_tokens
_.cache_hits  # ChatTokenizer's cache counters (benchmarks/rollout.py)
_.cache_misses
read_demos
padding_report  # benchmarks/packing.py
build_tiny_head64  # tests/server/test_vllm_real.py and the README's vLLM check
_.update_from_tensors  # SGLang's weight-update API (client/weights.py), tests/server/test_engines.py
_.init_weights_update_group
_.update_from_distributed
expected_score  # the tiny reward model's reference score, for tests
sample_tokens  # sampling by GenerationParams rows, tests/server/test_server.py

# ---- config fields read by dotted name (OmegaConf.select, cfg[key], the key tables in compat/) or accepted as
# another system's key with no effect here (the schema must still declare them: agentgym/config_schema)
num_cycles
free_cache_engine
gen_batch_size
turn_reward_from
max_critic_ckpt_to_keep
shutdown_timeout
num_cpus
include_dashboard

# envs/workspace/server.py: the server dispatches requests to op_<name> by getattr
op_run
op_files
op_read
op_archive
op_extract
