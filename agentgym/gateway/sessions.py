"""Gateway sessions: the token-exact record of what a black-box agent's model calls saw and sampled.

A session is one agent episode. The gateway renders every chat request itself and records, per
*branch*, one growing token sequence: the prompt tokens it sent (loss mask 0) and the token ids
the server sampled with their logprobs (mask 1). A request is matched against the branches
recorded so far, message by message; a re-sent assistant message matches a recorded one when
its text and tool calls equal what the model produced (see ``same_reply``):

* **extend** — the request re-sends a branch's whole history and adds new messages (the usual
  agent loop). The new turn's prompt is the template's delta for the new messages, appended
  after the model's own sampled ids: nothing the model wrote is re-tokenized.
* **fork** — the request matches a branch only up to one of the model's replies (the agent
  dropped, edited or re-ordered what came after, retried an earlier call, or asked for ``n > 1``
  samples). A new branch starts whose first prompt is the recorded tokens up to that reply,
  read-only (mask 0, so no sampled token is trained twice), plus the delta.
* **fresh** — nothing matches (the first call, an edited first prompt, or a different tool list:
  the template writes the tools into the system prompt): the request is rendered from scratch.

Each branch becomes its own ``Trajectory`` at finish; the session's ``branches`` metric counts
them (``first_reply`` / ``last_reply``: where the branch's turns fall among the session's replies). An
agent that rewrites its context (drops old turns, summarises them) makes a *chain* of branches, one
after the other; ``agentgym.gateway.episodes`` joins a chain back into one episode whose later
branches start new contexts, trained as per-turn samples (docs/long_horizon.md).
Text completions (``/v1/completions``) keep their own branches: a prompt that starts with
a branch's prompt plus the completion text it was given extends it (a token-id prompt must start
with the branch's token ids); anything else is fresh.

Rewards: the agent may post final (outcome) and turn rewards; a reward function named in the
task (``{"reward_fn": "gsm8k", "ground_truth": "72"}``) is applied at finish to each branch's
last assistant message. Both are summed into the outcome reward.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentgym.envs.tools.parsing import load_json
from agentgym.gateway.rewards import ground_truth, resolve_reward_fn, task_reward_fn
from agentgym.rollout.chat import ChatTokenizer, tools_key
from agentgym.server.errors import ERROR_TYPES, APIError
from agentgym.types import TokenSample, Trajectory, Turn

log = logging.getLogger("agentgym.gateway")


# ---- messages ----------------------------------------------------------------------------------
def normalize_message(message: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI message in the plain form the chat template and the matcher use: string content
    (text parts joined), ``developer`` as ``system``, tool-call arguments as JSON text."""
    role = message.get("role")
    if role == "developer":
        role = "system"
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", None) and isinstance(p.get("text"), str)
        )  # a part whose text is not a string adds nothing
    out: dict[str, Any] = {"role": role, "content": content}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [_normalize_call(c) for c in calls]
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            out[key] = message[key]
    return out


def _normalize_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps({} if arguments is None else arguments, ensure_ascii=False)
    return {
        "id": call.get("id") or "",
        "type": "function",
        "function": {"name": function.get("name") or "", "arguments": arguments},
    }


def _json_equal(a: str, b: str) -> bool:
    """Arguments equal as JSON; empty arguments (a call cut by ``max_tokens`` before them) equal ``{}``,
    as the Messages API hands such a call to the client (``input: {}``) and gets it back."""
    a, b = a or "{}", b or "{}"
    if a == b:
        return True
    try:
        return load_json(a) == load_json(b)
    except (TypeError, ValueError, RecursionError):  # not JSON, or nested past what can be compared
        return False


def same_reply(sent: dict[str, Any], recorded: dict[str, Any]) -> bool:
    """Whether a re-sent assistant message is the model's recorded reply: the same content (surrounding
    whitespace ignored) and the same tool calls (names equal, arguments equal as JSON; ids ignored)."""
    if sent.get("role") != "assistant":
        return False
    if (sent.get("content") or "").strip() != (recorded.get("content") or "").strip():
        return False
    a, b = sent.get("tool_calls") or [], recorded.get("tool_calls") or []
    return len(a) == len(b) and all(
        x["function"]["name"] == y["function"]["name"]
        and _json_equal(x["function"]["arguments"], y["function"]["arguments"])
        for x, y in zip(a, b)
    )


# ---- branches and sessions ---------------------------------------------------------------------
@dataclass
class Branch:
    """One token sequence of a session; becomes one Trajectory.

    ``checkpoints`` are ``(messages, tokens)`` right after each model reply: how many messages of
    the history and how many tokens of ``token_ids`` the reply ends. A request can extend or fork
    a branch only at a checkpoint, where the token sequence is known exactly. ``replies`` maps the
    position of each model reply in ``messages`` to the raw text the model sampled.
    """

    index: int
    kind: Literal["chat", "text"] = "chat"
    tools: list[dict[str, Any]] | None = None
    tkey: str = ""
    parent: tuple[int, int] | None = None  # (branch, messages) it forked from
    messages: list[dict[str, Any]] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    replies: dict[int, str] = field(default_factory=dict)
    checkpoints: list[tuple[int, int]] = field(default_factory=list)
    text: str = ""  # text branches: the prompt and completions as the agent saw them
    pending: bool = False
    commits: list[int] = field(default_factory=list)  # each turn's place among the session's replies (1, 2, ...)

    def matched(self, messages: Sequence[dict[str, Any]]) -> int:
        """How many leading ``messages`` equal this branch's (model replies compared by ``same_reply``)."""
        n = min(len(messages), len(self.messages))
        for i in range(n):
            recorded, sent = self.messages[i], messages[i]
            if not (same_reply(sent, recorded) if i in self.replies else sent == recorded):
                return i
        return n


_Match = tuple[int, int, int, Branch]
"""A checkpoint a chat request continues from: (messages matched, extends the branch, branch index, branch)."""


@dataclass
class Plan:
    """A generation the gateway is about to run for a session, reserved on its branch."""

    branch: Branch
    kind: Literal["extend", "fork", "fresh"]
    context_ids: list[int]  # the whole sequence the server continues
    turn_prompt_ids: list[int]  # the new turn's prompt tokens (mask 0)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the request's history (chat)
    observation: list[dict[str, Any]] = field(default_factory=list)  # the messages this turn added
    prompt_text: str = ""  # text branches: the prompt as sent


@dataclass
class PostedReward:
    reward: float
    kind: Literal["final", "turn"]
    branch: int | None
    turn: int | None


@dataclass
class Session:
    """One agent episode: its task, its key, its branches and the rewards posted to it."""

    id: str
    key: str
    task: dict[str, Any]
    group_id: str
    sampling: dict[str, Any]  # pinned: overrides what the agent asks for
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    branches: list[Branch] = field(default_factory=list)
    active: int | None = None  # the branch of the latest completion
    rewards: list[PostedReward] = field(default_factory=list)
    requests: int = 0
    commits: int = 0  # replies recorded (the order of turns across branches)
    finished: bool = False
    failure: str | None = None
    trajectories: list[Trajectory] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)  # the admin's own notes (the query API)
    calls: list[dict[str, Any]] = field(default_factory=list)  # one record per model call (the query API)
    responses: dict[str, tuple[str | None, list[dict[str, Any]]]] = field(default_factory=dict)
    # the Responses API's previous_response_id: id -> (the response it continued, the messages it added)
    finished_at: float | None = None
    record: Any = None  # once finished: the ArchivedSession written to the archive
    archived: Any = None  # the archive's write of it (a future)

    @property
    def status(self) -> str:
        """``open``, ``finished``, or ``failed`` (finished with a failure)."""
        return "open" if not self.finished else ("failed" if self.failure else "finished")

    def header(self) -> dict[str, Any]:
        """The session as the listing shows it."""
        return {
            "id": self.id,
            "group_id": self.group_id,
            "status": self.status,
            "created": self.created,
            "finished_at": self.finished_at,
            "metadata": self.metadata,
            "requests": self.requests,
            "failure": self.failure,
        }

    def post_reward(
        self,
        reward: float,
        kind: Literal["final", "turn"] = "final",
        turn: int | None = None,
        branch: int | None = None,
    ) -> PostedReward:
        """Record a reward; it belongs to ``branch`` (default: the branch of the latest completion) and,
        for a turn reward, to ``turn`` (default: that branch's latest turn)."""
        if self.finished:
            raise ValueError(f"session {self.id} is finished; post rewards before finishing it")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"a reward must be a finite number, got {reward!r}")
        if any(v is not None and (isinstance(v, bool) or not isinstance(v, int)) for v in (turn, branch)):
            raise ValueError(f"turn and branch must be integers, got turn={turn!r}, branch={branch!r}")
        branch = self.active if branch is None else branch
        if branch is not None and not 0 <= branch < len(self.branches):
            raise ValueError(f"session {self.id} has no branch {branch} (it has {len(self.branches)})")
        if kind == "turn":
            if branch is None or not self.branches[branch].turns:
                raise ValueError(f"session {self.id} has no completed turn to reward yet")
            turns = self.branches[branch].turns
            turn = len(turns) - 1 if turn is None else turn
            if not 0 <= turn < len(turns):
                raise ValueError(f"branch {branch} of session {self.id} has no turn {turn} (it has {len(turns)})")
        posted = PostedReward(float(reward), kind, branch, turn)
        self.rewards.append(posted)
        return posted

    def summary(self, with_tokens: bool = True) -> dict[str, Any]:
        """The session as JSON: its task, state, rewards and each branch's recorded turns."""

        def branch(b: Branch) -> dict[str, Any]:
            out: dict[str, Any] = {
                "index": b.index,
                "kind": b.kind,
                "parent": b.parent,
                "messages": b.messages,
                "num_turns": len(b.turns),
                "num_tokens": len(b.token_ids),
            }
            if with_tokens:
                out["turns"] = [_turn_dict(t) for t in b.turns]
            return out

        return {
            "id": self.id,
            "group_id": self.group_id,
            "task": self.task,
            "sampling": self.sampling,
            "finished": self.finished,
            "failure": self.failure,
            "requests": self.requests,
            "status": self.status,
            "created": self.created,
            "finished_at": self.finished_at,
            "metadata": self.metadata,
            "active_branch": self.active,
            "rewards": [vars(r) for r in self.rewards],
            "branches": [branch(b) for b in self.branches if b.turns],
        }


def _turn_dict(turn: Turn) -> dict[str, Any]:
    return {
        "prompt_ids": turn.prompt_ids,
        "response_ids": turn.response_ids,
        "logprobs": turn.logprobs,
        "reward": turn.reward,
        "weight_version": turn.weight_version,
        "finish_reason": turn.finish_reason,
        "observation": turn.observation,
        "response_text": turn.response_text,
    }


class SessionError(APIError):
    """A request a session cannot take; ``status`` is the HTTP status the gateway answers with."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(status, message, ERROR_TYPES.get(status, "invalid_request_error"), param, code)


class SessionStore:
    """Every open session, the finished ones (the latest ``keep_finished``), and the token bookkeeping.

    ``chat``: the ``ChatTokenizer`` that renders prompts and deltas. Every ``template_check_every``-th
    finished session is re-rendered and compared with its tokens (``template_mismatch``); 0: never.
    A session nobody has used for ``idle_timeout`` seconds is finished as failed (``"expired"``), so
    abandoned sessions do not pile up.
    """

    def __init__(
        self,
        chat: ChatTokenizer,
        keep_finished: int = 10_000,
        template_check_every: int = 1,
        idle_timeout: float = 3600.0,
        id_prefix: str = "",
        allowed_reward_fns: Collection[str] = (),
    ) -> None:
        self.chat = chat
        self.allowed_reward_fns = tuple(allowed_reward_fns)  # import paths a task may name (validation.py)
        self.id_prefix = id_prefix  # a multi-worker gateway's worker index: w<k>-
        self.keep_finished = keep_finished
        self.template_check_every = template_check_every
        self.idle_timeout = idle_timeout
        self._next_sweep = time.monotonic() + 60.0
        self.open: dict[str, Session] = {}
        self.finished: OrderedDict[str, Session] = OrderedDict()
        self._by_key: dict[str, str] = {}
        self.on_finish: Callable[[Session], None] | None = None  # sees every session as it finishes
        self.counts = {
            "sessions": 0,
            "finished": 0,
            "requests": 0,
            "extend": 0,
            "fork": 0,
            "fresh": 0,
            "branches": 0,
            "template_mismatch": 0,
            "expired": 0,
        }

    # ---- sessions --------------------------------------------------------------------------
    def create(
        self,
        task: dict[str, Any] | None = None,
        group_id: str | None = None,
        sampling: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Session:
        task = dict(task or {})
        name = task_reward_fn(task)
        if name is not None:
            resolve_reward_fn(name, self.allowed_reward_fns)  # a typo fails here, not at finish
            ground_truth(task)
        sid = self.id_prefix + uuid.uuid4().hex
        session = Session(
            id=sid,
            key=f"sk-agentgym-{secrets.token_urlsafe(24)}",
            task=task,
            group_id=str(group_id) if group_id is not None else sid,
            sampling=dict(sampling or {}),
            metadata=dict(metadata or {}),
        )
        self.open[sid] = session
        self._by_key[session.key] = sid
        self.counts["sessions"] += 1
        if time.monotonic() >= self._next_sweep:
            self.expire()
        return session

    def expire(self) -> int:
        """Finish (as failed) every open session idle for over ``idle_timeout``; returns how many.
        Never raises: one session that cannot be finished is logged and dropped, not a failure of
        whatever request ran the sweep."""
        self._next_sweep = time.monotonic() + 60.0
        limit = time.monotonic() - self.idle_timeout
        stale = [s for s in self.open.values() if s.last_used < limit and not any(b.pending for b in s.branches)]
        for session in stale:
            try:
                self.finish(session, failure=f"expired: no request for {self.idle_timeout:.0f}s and never finished")
            except Exception:  # finish() guards each branch; this is the last line of defence
                log.exception("could not finish expired session %s; dropping it", session.id)
                self.open.pop(session.id, None)
                self._by_key.pop(session.key, None)
        self.counts["expired"] += len(stale)
        return len(stale)

    def get(self, sid: str) -> Session:
        session = self.open.get(sid) or self.finished.get(sid)
        if session is None:
            raise SessionError(
                404,
                f"no session {sid!r}: create one with POST /sessions (finished sessions are "
                f"kept for the latest {self.keep_finished})",
                "session_not_found",
            )
        return session

    def delete(self, sid: str) -> Session | None:
        """Forget a session, open or finished (an open one takes no more calls: they get a 404)."""
        session = self.open.pop(sid, None) or self.finished.pop(sid, None)
        if session is not None:
            self._by_key.pop(session.key, None)
        return session

    def owner(self, key: str) -> str | None:
        """The session a key belongs to (None for an unknown key)."""
        return self._by_key.get(key)

    def finish(self, session: Session, failure: str | None = None, reward: float | None = None) -> list[Trajectory]:
        """Close the session and build one Trajectory per branch. Calling it again returns the same list."""
        if session.trajectories is not None:
            return session.trajectories
        if reward is not None:
            session.post_reward(reward, "final")
        session.finished = True
        session.failure = failure
        session.finished_at = time.time()
        session.trajectories = self._trajectories(session)
        self.open.pop(session.id, None)
        self._by_key.pop(session.key, None)
        self.finished[session.id] = session
        while len(self.finished) > self.keep_finished:
            self.finished.popitem(last=False)
        self.counts["finished"] += 1
        if self.on_finish is not None:
            self.on_finish(session)
        return session.trajectories

    # ---- planning: which branch a request extends ----------------------------------------
    def _chat_match(self, session: Session, messages: list[dict[str, Any]], tkey: str) -> _Match | None:
        """The branch checkpoint a chat request continues from (the most messages matched, then a
        branch it extends, then the latest branch), or None: it starts a fresh branch."""
        best: _Match | None = None
        for b in session.branches:
            if b.kind != "chat" or b.tkey != tkey or not b.checkpoints:
                continue
            matched = b.matched(messages)
            point = next(((m, t) for m, t in reversed(b.checkpoints) if m <= matched), None)
            if point is None:
                continue
            extends = int(point[0] == len(b.messages) and not b.pending)
            key = (point[0], extends, b.index, b)
            if best is None or key[:3] > best[:3]:
                best = key
        return best

    def _chat_delta(
        self, match: _Match, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, tkey: str
    ) -> tuple[int, list[int]]:
        """Where on ``match``'s branch the request's context leaves it (a token count) and the
        tokens it adds there."""
        m, _, _, source = match
        t = dict(source.checkpoints)[m]
        return t, self.chat.delta_ids(messages[m:], tools, source.token_ids[t - 1], tkey=tkey)

    def chat_context(
        self, session: Session, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        """The tokens ``plan_chat`` would make a chat request's context (the prompt it is sampled
        from), with nothing reserved, counted or recorded: what ``count_tokens`` counts."""
        tkey = tools_key(tools)
        match = self._chat_match(session, messages, tkey)
        if match is None:
            return self.chat.prompt_ids(messages, tools, tkey=tkey)
        t, delta = self._chat_delta(match, messages, tools, tkey)
        return match[3].token_ids[:t] + delta

    def plan_chat(self, session: Session, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Plan:
        """Match a chat request against the session's branches and reserve where its sample goes."""
        tkey = tools_key(tools)
        best = self._chat_match(session, messages, tkey)
        session.requests += 1
        session.last_used = time.monotonic()
        self.counts["requests"] += 1
        if best is None:
            ids = self.chat.prompt_ids(messages, tools, tkey=tkey)
            branch = self._new_branch(session, "chat", tools, tkey)
            plan = Plan(branch, "fresh", ids, ids, messages, list(messages))
        else:
            m, extends, _, source = best
            t, delta = self._chat_delta(best, messages, tools, tkey)
            context = source.token_ids[:t] + delta
            if extends:
                branch, kind, turn_prompt = source, "extend", list(delta)
            else:
                branch = self._fork(session, source, m, t)
                kind, turn_prompt = "fork", context
            plan = Plan(branch, kind, context, turn_prompt, messages, list(messages[m:]))
        plan.branch.pending = True
        self.counts[plan.kind] += 1
        return plan

    def plan_text(self, session: Session, prompt: str | list[int]) -> Plan:
        """Match a text-completion prompt (a string or token ids) against the session's text branches."""
        session.requests += 1
        session.last_used = time.monotonic()
        self.counts["requests"] += 1
        for b in reversed(session.branches):
            if b.kind != "text" or b.pending or not b.turns:
                continue
            if isinstance(prompt, str) and prompt.startswith(b.text):
                rest = prompt[len(b.text) :]
                delta = self.chat.encode(rest) if rest else []
            elif not isinstance(prompt, str) and prompt[: len(b.token_ids)] == b.token_ids:
                delta = list(prompt[len(b.token_ids) :])
            else:
                continue
            plan = Plan(b, "extend", b.token_ids + delta, delta, prompt_text=prompt if isinstance(prompt, str) else "")
            break
        else:
            ids = self.chat.encode(prompt) if isinstance(prompt, str) else list(prompt)
            plan = Plan(
                self._new_branch(session, "text", None, ""),
                "fresh",
                ids,
                ids,
                prompt_text=prompt if isinstance(prompt, str) else "",
            )
        plan.branch.pending = True
        self.counts[plan.kind] += 1
        return plan

    def siblings(self, session: Session, plan: Plan, count: int) -> list[Plan]:
        """``count`` more plans with the same context (``n > 1``): each a branch of its own whose first
        turn reads the whole context, so no already-sampled token is trained twice."""
        out = []
        b = plan.branch
        for _ in range(count):
            branch = self._fork(session, b, len(b.messages), len(b.token_ids))
            if plan.kind != "extend":  # b is new too: the sibling starts where b starts
                branch.parent = b.parent
            branch.pending = True
            kind: Literal["fork", "fresh"] = "fresh" if plan.kind == "fresh" else "fork"
            out.append(
                Plan(
                    branch,
                    kind,
                    plan.context_ids,
                    list(plan.context_ids),
                    plan.messages,
                    plan.observation,
                    plan.prompt_text,
                )
            )
            self.counts[kind] += 1
        return out

    def _new_branch(
        self, session: Session, kind: Literal["chat", "text"], tools: list[dict[str, Any]] | None, tkey: str
    ) -> Branch:
        branch = Branch(index=len(session.branches), kind=kind, tools=tools, tkey=tkey)
        session.branches.append(branch)
        self.counts["branches"] += 1
        return branch

    def _fork(self, session: Session, source: Branch, messages: int, tokens: int) -> Branch:
        branch = self._new_branch(session, source.kind, source.tools, source.tkey)
        branch.parent = (source.index, messages)
        branch.messages = source.messages[:messages]
        branch.token_ids = source.token_ids[:tokens]
        branch.replies = {i: text for i, text in source.replies.items() if i < messages}
        branch.checkpoints = [(m, t) for m, t in source.checkpoints if m <= messages]
        branch.text = source.text
        return branch

    # ---- recording -------------------------------------------------------------------------
    def commit(
        self,
        session: Session,
        plan: Plan,
        sample: TokenSample,
        reply: dict[str, Any] | None = None,
        text: str = "",
        shaped_by: Sequence[str] = (),
    ) -> Turn:
        """Record a sample on its planned branch. ``reply`` is the assistant message returned to the
        agent (chat); ``text`` the completion text returned (text completions); ``shaped_by``: what
        shaped its sampling besides temperature and the filters (``Turn.shaped_by``)."""
        b = plan.branch
        raw = self.chat.assistant_content(sample.token_ids)
        turn = Turn(
            prompt_ids=list(plan.turn_prompt_ids),
            response_ids=list(sample.token_ids),
            logprobs=list(sample.logprobs),
            weight_version=sample.weight_version,
            finish_reason=sample.finish_reason,
            observation=plan.observation,
            response_text=raw,
            shaped_by=list(shaped_by),
        )
        b.turns.append(turn)
        b.token_ids = plan.context_ids + list(sample.token_ids)
        if b.kind == "chat":
            b.replies[len(plan.messages)] = raw
            b.messages = list(plan.messages) + [reply or {"role": "assistant", "content": raw}]
            b.checkpoints.append((len(b.messages), len(b.token_ids)))
        else:
            b.text = (plan.prompt_text or self.chat.decode(plan.context_ids)) + text
        b.pending = False
        session.active = b.index
        session.commits += 1
        b.commits.append(session.commits)
        return turn

    def release(self, plan: Plan) -> None:
        """Give back a plan whose generation failed (its branch stays as it was)."""
        plan.branch.pending = False

    # ---- finishing -------------------------------------------------------------------------
    def _trajectories(self, session: Session) -> list[Trajectory]:
        task = session.task
        name = task_reward_fn(task)
        branches = [b for b in session.branches if b.turns]
        every = self.template_check_every
        check = every > 0 and self.counts["finished"] % every == 0
        out = []
        for b in branches:
            try:
                out.append(self._trajectory(session, b, len(branches), name, check))
            except Exception as exc:  # one branch that cannot be built must not lose the others
                log.exception("session %s: could not build branch %d's trajectory", session.id, b.index)
                out.append(
                    Trajectory(
                        turns=[Turn(**vars(t)) for t in b.turns],
                        env_id=str(task.get("env") or "gateway"),
                        group_id=session.group_id,
                        seed=task.get("seed"),
                        status="failed",
                        failure=f"the gateway could not build this trajectory: {type(exc).__name__}: {exc}",
                        data_source=str(task.get("data_source") or ""),
                        messages=list(b.messages),
                        metrics={"branch": float(b.index)},
                        task={**task, "session_id": session.id, "branch": b.index},
                    )
                )
        return out

    def _trajectory(self, session: Session, b: Branch, n_branches: int, name: str | None, check: bool) -> Trajectory:
        task = session.task
        turns = [Turn(**vars(t)) for t in b.turns]
        metrics: dict[str, float] = {
            "branches": float(n_branches),
            "branch": float(b.index),
            "active_branch": float(b.index == session.active),
            "requests": float(session.requests),
            # the branch's first and last reply among the session's (agentgym.gateway.episodes: a chain)
            "first_reply": float(b.commits[0] if b.commits else 0),
            "last_reply": float(b.commits[-1] if b.commits else 0),
        }
        posted = 0.0
        for r in session.rewards:
            if r.branch != b.index:
                continue
            if r.kind == "turn" and r.turn is not None:
                turns[r.turn].reward += r.reward
            else:
                posted += r.reward
        metrics["posted_reward"] = posted
        status, failure = ("failed", session.failure) if session.failure else ("ok", None)
        if status == "ok" and turns[-1].finish_reason == "length":
            status = "truncated"
        outcome = posted
        if name is not None and b.kind == "chat":
            try:
                score = float(resolve_reward_fn(name, self.allowed_reward_fns)(b.messages, task))
                if not math.isfinite(score):
                    raise ValueError(f"it returned {score}, not a finite number")
            except Exception as exc:  # a broken reward function must not lose the session
                status, failure = "failed", f"reward_fn {name!r} raised {type(exc).__name__}: {exc}"
                score = 0.0
            metrics["reward_fn_score"] = score
            outcome += score
        sampled = sum(len(t.response_ids) for t in turns)
        metrics.update(
            turns=float(len(turns)),
            sampled_tokens=float(sampled),
            tokens=float(sampled + sum(len(t.prompt_ids) for t in turns)),
            shaped_turns=float(sum(1 for t in turns if t.shaped_by)),  # Turn.shaped_by
        )
        if check and b.kind == "chat":
            metrics["template_mismatch"] = float(self._mismatch(b) is not None)
            self.counts["template_mismatch"] += int(metrics["template_mismatch"])
        traj = Trajectory(
            turns=turns,
            outcome_reward=outcome,
            env_id=str(task.get("env") or "gateway"),
            group_id=session.group_id,
            seed=task.get("seed"),
            status=status,
            failure=failure,
            data_source=str(task.get("data_source") or ""),
            messages=list(b.messages),
            metrics=metrics,
            task={**task, "session_id": session.id, "branch": b.index, "parent": b.parent},
        )
        traj.metrics["success"] = float(traj.success)  # saved with the trajectory, as the rollout runner does
        return traj

    def _mismatch(self, b: Branch) -> int | None:
        raw = [
            {"role": "assistant", "content": b.replies[i]} if i in b.replies else m for i, m in enumerate(b.messages)
        ]
        return self.chat.mismatch(raw, b.tools, b.token_ids)
