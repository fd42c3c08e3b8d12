"""TextArena games as text envs: ``ta/<game>`` for every registered TextArena env id.

    agentgym.make("ta/GuessTheNumber-v0")                       # one player
    agentgym.make("ta/TicTacToe-v0", opponent="random")         # two players, the policy vs a fixed agent
    agentgym.make("ta/TicTacToe-v0", self_play=True)            # both seats the policy

The game is ``textarena.make(game, **game_kwargs)`` with its own wrappers (so actions are
formatted as the game expects); observations are read from the game's state, so each turn the
model gets only what is new for its seat, as chat messages: TextArena's game prompt as the
system message, then the game's messages to that seat (``[GAME] ...``, ``[Player 1] ...``).

* One-player games: the policy plays seat 0.
* Two-player games against a fixed ``opponent``: ``"random"`` (a scripted agent that picks one of
  the moves the game lists, e.g. ``'[4]'``, seeded by the episode seed), ``"first"`` (always
  the first listed move), an OpenAI-compatible server URL (``http://host:port``: a second
  policy, chat completions, ``opponent_model``/``opponent_kwargs`` for the request), or
  ``"package.module:agent"`` (any TextArena ``Agent`` or callable ``observation -> action``).
  The policy plays ``seat`` (default: the episode seed's parity, so both seats get trained).
* ``self_play=True``: both seats are the policy. The env then follows agentgym's multi-agent
  protocol (``agents``; ``info["agent"]`` is the seat to act; see
  ``agentgym.rollout.multi_agent``) and the runner keeps one trajectory per seat.

Rewards are the game's: on the final step ``info["outcome_reward"]`` (``outcome_rewards`` per
seat in self-play) is TextArena's reward for the seat (+1 win, -1 loss, 0 draw for two-player
games; the game's own score for one-player games); turn rewards are 0.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from agentgym.envs.base import TextEnv, reply_text
from agentgym.registry import EnvFamily, EnvSpec, import_object
from agentgym.types import Action, Message

GAME_ID = -1
_MOVE = re.compile(r"'(\[[^\[\]']{1,40}\])'")  # a listed move: '[4]', '[guess 50]'
_BRACKETED = re.compile(r"\[[^\[\]\n]{1,40}\]")


def _agent_name(player: int) -> str:
    return f"player_{player}"


class RandomMoveAgent:
    """A scripted opponent: one of the moves the game lists in its last message (quoted, like
    ``'[4]'``), else any bracketed token that is not a speaker tag, else ``"[0]"``."""

    def __init__(self, seed: int | None = None, first: bool = False) -> None:
        self.rng = random.Random(seed)
        self.first = first

    def __call__(self, observation: str) -> str:
        tail = observation[observation.rfind("[GAME]") :] if "[GAME]" in observation else observation
        moves = _MOVE.findall(tail) or [
            m for m in _BRACKETED.findall(tail) if m not in ("[GAME]",) and not m.startswith("[Player")
        ]
        if not moves:
            return "[0]"
        return moves[0] if self.first else self.rng.choice(moves)


class PolicyServerAgent:
    """A second policy as the opponent: an OpenAI-compatible server's chat completions, with the
    game's conversation for its seat kept across turns."""

    def __init__(
        self, url: str, model: str = "default", system_prompt: str | None = None, timeout: float = 120.0, **request: Any
    ) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.model = model
        self.request = {"max_tokens": 64, "temperature": 1.0, **request}
        self.system_prompt = system_prompt
        self.http = httpx.Client(timeout=timeout)
        self.messages: list[dict[str, Any]] = []

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []

    def __call__(self, observation: str) -> str:
        self.messages.append({"role": "user", "content": observation})
        response = self.http.post(
            f"{self.url}/v1/chat/completions", json={"model": self.model, "messages": self.messages, **self.request}
        )
        response.raise_for_status()
        text = response.json()["choices"][0]["message"].get("content") or ""
        self.messages.append({"role": "assistant", "content": text})
        return text

    def close(self) -> None:
        self.http.close()


class TextArenaEnv(TextEnv):
    """A TextArena game: one player, or two against a fixed opponent, or in self-play."""

    def __init__(
        self,
        game: str,
        num_players: int | None = None,
        opponent: str | Callable[[str], str] = "random",
        seat: int | None = None,
        self_play: bool = False,
        system_prompt: str | None = None,
        opponent_model: str = "default",
        opponent_kwargs: dict[str, Any] | None = None,
        max_turns: int | None = None,
        render_mode: str | None = None,
        **game_kwargs: Any,
    ) -> None:
        super().__init__(render_mode=render_mode)
        import textarena as ta
        from textarena.agents.basic_agents import STANDARD_GAME_PROMPT

        self.game = game
        self.ta_env = ta.make(game, **game_kwargs)
        self.inner = self.ta_env
        while hasattr(self.inner, "env") and isinstance(self.inner, ta.Wrapper):
            self.inner = self.inner.env  # the game itself: its state queues each seat's new messages
        self.num_players = num_players
        self.self_play = self_play
        self.seat_option = seat
        self.system_prompt = STANDARD_GAME_PROMPT if system_prompt is None else system_prompt
        self.opponent_spec = opponent
        self.opponent_model = opponent_model
        self.opponent_kwargs = dict(opponent_kwargs or {})
        self.max_turns = max_turns
        self.opponent: Callable[[str], str] | None = None
        self.seat = 0
        self.done = True
        self._started: set[int] = set()
        self._opponent_log: list[str] = []
        self.last_rewards: dict[int, float] = {}
        if self_play:
            self.agents = [_agent_name(0), _agent_name(1)]

    # ---- the game ------------------------------------------------------------------------
    def _reset_game(self, seed: int | None) -> None:
        if self.num_players is not None:
            self.ta_env.reset(num_players=self.num_players, seed=seed)
            return
        for players in (1, 2):  # TextArena games assert their player count at reset
            try:
                self.ta_env.reset(num_players=players, seed=seed)
            except AssertionError as exc:
                if "players" not in str(exc).lower() or players == 2:
                    raise
                continue
            self.num_players = players
            return

    def _messages_for(self, player: int, raw: list[Any]) -> list[Message]:
        """A seat's new raw TextArena messages as chat messages (its own echoed moves left out)."""
        roles = getattr(self.inner.state, "role_mapping", {}) or {}
        lines = []
        for item in raw:
            sender, text = item[0], item[1]
            kind = getattr(item[2], "name", "") if len(item) > 2 else ""
            if sender == player and kind == "PLAYER_ACTION":
                continue
            name = roles.get(sender, "GAME" if sender == GAME_ID else f"Player {sender}")
            lines.append(f"[{name}] {text.strip()}")
        messages: list[Message] = []
        if player not in self._started:
            self._started.add(player)
            if self.system_prompt:
                messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": "\n".join(lines)})
        return messages

    def _observe(self) -> tuple[int, list[Any]]:
        player, raw = self.inner.get_observation()
        return int(player), list(raw or [])

    def _text(self, raw: list[Any]) -> str:
        return "\n".join(f"[{'GAME' if m[0] == GAME_ID else f'Player {m[0]}'}] {m[1]}" for m in raw)

    def _finish(self) -> dict[str, Any]:
        self.done = True
        result = self.ta_env.close()
        rewards, game_info = result if isinstance(result, tuple) else (result, {})
        self.last_rewards = {int(k): float(v) for k, v in (rewards or {}).items()}
        invalid = {int(k): float(bool((v or {}).get("invalid_move"))) for k, v in (game_info or {}).items()}
        reason = next((str(v.get("reason")) for v in (game_info or {}).values() if v and v.get("reason")), "")
        return {"game_info": game_info, "invalid": invalid, "reason": reason}

    def _opponent_moves(self) -> tuple[bool, dict[str, Any]]:
        """Let the fixed opponent play until it is the policy's turn or the game ends."""
        assert self.opponent is not None
        done, step_info = False, {}
        while not done:
            player, raw = self._observe()
            if player == self.seat:
                self._pending = raw
                return False, step_info
            move = self.opponent(self._text(raw))
            self._opponent_log.append(move)
            done, step_info = self.ta_env.step(move)
        return True, step_info

    # ---- TextEnv -------------------------------------------------------------------------
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed)
        self._reset_game(seed)
        self.done = False
        self._started = set()
        self._opponent_log = []
        info: dict[str, Any] = {"data_source": f"ta/{self.game}"}
        if self.self_play:
            if self.num_players != 2:
                raise ValueError(f"self_play needs a two-player game; {self.game} has {self.num_players} player(s)")
            player, raw = self._observe()
            info["agent"] = _agent_name(player)
            return self._messages_for(player, raw), info
        if self.num_players == 1:
            self.seat = 0
            player, raw = self._observe()
            return self._messages_for(player, raw), info
        self.seat = self.seat_option if self.seat_option is not None else (seed or 0) % self.num_players
        self.opponent = self._make_opponent(seed)
        done, _ = self._opponent_moves()
        info["seat"] = self.seat
        if done:  # the opponent ended the game before the policy's first move
            self._finish()
            self._pending = []
        return self._messages_for(self.seat, self._pending), info

    def _make_opponent(self, seed: int | None) -> Callable[[str], str]:
        spec = self.opponent_spec
        if callable(spec):
            return spec
        if spec in ("random", "first"):
            return RandomMoveAgent(seed, first=spec == "first")
        if spec.startswith(("http://", "https://")):
            if self.opponent is not None and isinstance(self.opponent, PolicyServerAgent):
                self.opponent.reset()
                return self.opponent
            agent = PolicyServerAgent(
                spec, model=self.opponent_model, system_prompt=self.system_prompt, **self.opponent_kwargs
            )
            agent.reset()
            return agent
        target = import_object(spec)
        return target() if isinstance(target, type) else target

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        if self.done:
            raise RuntimeError("call reset() before step(): the game has ended")
        text = reply_text(action)
        info: dict[str, Any] = {"data_source": f"ta/{self.game}"}
        if self.self_play:
            done, _ = self.ta_env.step(text)
            if done:
                result = self._finish()
                outcomes = {_agent_name(p): r for p, r in self.last_rewards.items()}
                info.update(
                    outcome_rewards=outcomes,
                    successes={a: r > 0 for a, r in outcomes.items()},
                    metrics={
                        "draw": float(all(r == 0 for r in outcomes.values())),
                        "invalid_move": float(any(result["invalid"].values())),
                    },
                    reason=result["reason"],
                )
                return [], 0.0, True, False, info
            player, raw = self._observe()
            info["agent"] = _agent_name(player)
            return self._messages_for(player, raw), 0.0, False, False, info
        done, _ = self.ta_env.step(text)
        if not done and self.num_players != 1:
            done, _ = self._opponent_moves()
        if not done:
            if self.num_players == 1:
                player, self._pending = self._observe()
            return self._messages_for(self.seat, self._pending), 0.0, False, False, info
        result = self._finish()
        reward = self.last_rewards.get(self.seat, 0.0)
        info.update(
            outcome_reward=reward,
            success=reward > 0,
            reason=result["reason"],
            metrics={
                "invalid_move": result["invalid"].get(self.seat, 0.0),
                "opponent_moves": float(len(self._opponent_log)),
            },
        )
        return [], 0.0, True, False, info

    def close(self) -> None:
        if isinstance(self.opponent, PolicyServerAgent):
            self.opponent.close()


class TextArenaFamily(EnvFamily):
    prefix = "ta"
    member_label = "game"
    description = "TextArena games: one player, two against an opponent, or self-play"
    requires = "textarena"
    extra = "textarena"

    def members(self) -> list[str]:
        import textarena  # noqa: F401 - registers the games
        from textarena.envs.registration import ENV_REGISTRY

        return sorted(ENV_REGISTRY)

    def member_spec(self, member: str) -> EnvSpec:
        return EnvSpec(
            name=f"ta/{member}", entry_point=TextArenaEnv, kwargs={"game": member}, description=f"TextArena {member}"
        )


FAMILY = TextArenaFamily()
