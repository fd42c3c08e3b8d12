"""FrozenLake as a multi-turn text environment (RAGEN's and ROLL's second benchmark).

Gymnasium's ``FrozenLake-v1`` plays underneath (``gymnasium.envs.toy_text.frozen_lake``: its
transitions, its slippery ice, its reward of 1 at the goal); this module renders the lake as text
and reads moves from replies, the way ROLL's ``frozen_lake`` env (and RAGEN's) does:

* the board, one row per line: ``P`` you, ``_`` frozen ice, ``O`` a hole, ``G`` the goal, ``X`` you
  in a hole, ``√`` you on the goal (``grid_lookup`` / ``grid_vocab`` change the symbols and their
  legend, as in ROLL);
* a reply ``<answer>Left</answer>``: one of Left, Down, Right, Up (case-insensitive; the last answer
  tag counts). With ``max_actions_per_turn > 1`` a reply may chain moves, ``<answer>Down || Right</answer>``
  (RAGEN's form).

Each episode is a new lake drawn from its seed (ROLL's generator: ``size`` x ``size`` cells, each frozen
with probability ``p``, start and goal at random cells, redrawn until the goal can be reached);
``map_seed`` fixes one lake for every episode. With ``is_slippery`` a move goes the intended way with
probability 1/3 and to either side otherwise (gymnasium's ice, seeded by the episode's seed).

Rewards: a turn's reward is gymnasium's (1 when the goal is reached) plus ``format_penalty`` for a reply
with no readable move (which moves nothing and uses one step). The final step's ``info`` has
``outcome_reward`` (1.0 on the goal, else 0.0) and ``success``. ``terminated``: on the goal or in a
hole; ``truncated``: ``max_steps`` moves used.

Expert: ``expert_action()`` plays the move with the best chance of reaching the goal from here
(value iteration over gymnasium's transition table; on ice that does not slip, a shortest path), so
``agentgym demos --env frozenlake`` writes demonstrations.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, ClassVar

from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
from gymnasium.error import ResetNeeded

from agentgym.envs.answer_tag import last_answer
from agentgym.envs.base import TextEnv, reply_text
from agentgym.envs.sokoban import legend_pairs
from agentgym.registry import EnvSpec
from agentgym.types import Action, Message

ACTIONS = ("Left", "Down", "Right", "Up")
"""Gymnasium's action ids 0..3, named as ROLL's ``ACTION_LOOKUP`` names them."""

GRID_LOOKUP = {"player": "P", "frozen": "_", "hole": "O", "goal": "G", "player_in_hole": "X", "player_on_goal": "√"}
_ROLL_CELLS = ("player", "frozen", "hole", "goal", "player_in_hole", "player_on_goal")  # ROLL's grid_lookup keys 0..5
GRID_VOCAB = {"P": "player", "_": "empty", "O": "hole", "G": "goal", "X": "player in hole", "√": "player on goal"}
INSTRUCTION = (
    "You are solving the FrozenLake puzzle. Avoid the holes and go to the goal. "
    "{slippery}The answer must be one of action in a turn, format is <answer>Right</answer>"
)
SLIPPERY = "You may move to the unintended direction due to the slippery ice. "
MAX_REPLY_CHARS = 8192


def random_lake(rng: random.Random, size: int, p: float, max_tries: int = 10_000) -> list[str]:
    """A ``size`` x ``size`` lake as gymnasium's ``desc`` rows (S start, F frozen, H hole, G goal): each
    cell frozen with probability ``p``, start and goal on two random cells, redrawn until a path of
    frozen cells joins them (ROLL's ``generate_random_map``)."""
    if size < 2 or not 0.0 < p <= 1.0:
        raise ValueError(f"a lake needs size >= 2 and 0 < p <= 1, got size={size}, p={p}")
    for _ in range(max_tries):
        cells = [["F" if rng.random() < p else "H" for _ in range(size)] for _ in range(size)]
        start, goal = rng.sample(range(size * size), 2)
        cells[start // size][start % size] = "S"
        cells[goal // size][goal % size] = "G"
        rows = ["".join(r) for r in cells]
        if shortest_path(rows, start) is not None:
            return rows
    raise RuntimeError(f"no lake with a path in {max_tries} draws (size={size}, p={p}): raise p")


def shortest_path(rows: list[str], start: int) -> list[int] | None:
    """Action ids of a shortest walk from cell ``start`` to the goal over non-hole cells (ice that does
    not slip), or None when the goal cannot be reached."""
    size_r, size_c = len(rows), len(rows[0])
    steps = ((0, -1), (1, 0), (0, 1), (-1, 0))  # Left, Down, Right, Up: gymnasium's ids
    parent: dict[int, tuple[int, int]] = {start: (-1, -1)}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        r, c = divmod(cell, size_c)
        if rows[r][c] == "G":
            path = []
            while parent[cell][0] != -1:
                cell, action = parent[cell]
                path.append(action)
            return path[::-1]
        if rows[r][c] == "H":
            continue
        for action, (dr, dc) in enumerate(steps):
            nr, nc = r + dr, c + dc
            if 0 <= nr < size_r and 0 <= nc < size_c and (nxt := nr * size_c + nc) not in parent:
                parent[nxt] = (cell, action)
                queue.append(nxt)
    return None


def goal_values(lake: GymFrozenLake, gamma: float = 0.99, sweeps: int = 500) -> list[list[float]]:
    """Q-values of every (state, action) for reaching the goal, by value iteration over gymnasium's
    transition table ``lake.P`` (reward 1 at the goal, discount ``gamma`` so shorter is better)."""
    states = lake.observation_space.n
    value = [0.0] * states
    q = [[0.0] * 4 for _ in range(states)]
    for _ in range(sweeps):
        delta = 0.0
        for s in range(states):
            for a in range(4):
                q[s][a] = sum(
                    prob * (reward + (0.0 if done else gamma * value[nxt])) for prob, nxt, reward, done in lake.P[s][a]
                )
            best = max(q[s])
            delta = max(delta, abs(best - value[s]))
            value[s] = best
        if delta < 1e-9:
            break
    return q


def parse_moves(text: str, max_moves: int) -> tuple[list[int], str | None]:
    """Action ids from the last ``<answer>...</answer>`` of a reply (``||`` separates moves); returns
    ``(moves, error)``: an error (then no moves) when there is no tag, an unknown word or too many."""
    text = text[-MAX_REPLY_CHARS:]
    answer = last_answer(text)
    if answer is None:
        return [], "no <answer>...</answer> found"
    words = [w.strip() for w in answer.split("||")]
    words = [w for w in words if w]
    if not words:
        return [], "the answer had no move"
    if len(words) > max_moves:
        return [], f"at most {max_moves} move{'s' if max_moves > 1 else ''} per answer, got {len(words)}"
    names = {name.lower(): i for i, name in enumerate(ACTIONS)}
    moves = []
    for word in words:
        if word.lower() not in names:
            return [], f"{word[:20]!r} is not a move (Left, Down, Right, Up)"
        moves.append(names[word.lower()])
    return moves, None


class FrozenLakeEnv(TextEnv):
    """FrozenLake: walk over the ice to the goal without falling into a hole (default 4x4, ice that
    does not slip, 20 moves). See the module docstring for the board, the answer format and rewards.

    ``size``, ``p`` (the chance a cell is frozen), ``is_slippery``, ``map_seed`` (one fixed lake) and
    ``max_steps`` shape the task; ``max_actions_per_turn`` moves per reply; ``format_penalty`` for an
    unreadable reply. ROLL's options: ``grid_lookup`` (ROLL's cell ids 0..5 -> symbols),
    ``grid_vocab`` (symbol -> meaning, or ``[symbol, meaning]`` pairs: the legend in the prompt), ``env_instruction``
    (the rules
    text); ``system_prompt`` replaces the whole system message. Presets: ``frozenlake-4x4``,
    ``frozenlake-4x4-slippery``, ``frozenlake-8x8``, ``frozenlake-8x8-slippery``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = False,
        max_steps: int = 20,
        max_actions_per_turn: int = 1,
        format_penalty: float = 0.0,
        map_seed: int | None = None,
        grid_lookup: dict[Any, str] | None = None,
        grid_vocab: Any = None,
        env_instruction: str | None = None,
        system_prompt: str | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        if max_steps < 1 or max_actions_per_turn < 1:
            raise ValueError("max_steps and max_actions_per_turn must be at least 1")
        self.size, self.p, self.is_slippery = int(size), float(p), bool(is_slippery)
        self.max_steps, self.max_actions_per_turn = int(max_steps), int(max_actions_per_turn)
        self.format_penalty = float(format_penalty)
        self.map_seed = map_seed
        self.symbols = dict(GRID_LOOKUP)
        if grid_lookup:  # ROLL: {0: "P", 1: "_", 2: "O", 3: "G", 4: "X", 5: "√"}
            for key, symbol in grid_lookup.items():
                index = int(key)
                if not 0 <= index < len(_ROLL_CELLS):
                    raise ValueError(f"grid_lookup keys are ROLL's cell ids 0..5, got {key!r}")
                self.symbols[_ROLL_CELLS[index]] = str(symbol)
        self.vocab = legend_pairs(grid_vocab) or [(self.symbols[c], GRID_VOCAB[GRID_LOOKUP[c]]) for c in _ROLL_CELLS]
        instruction = (
            env_instruction
            if env_instruction is not None
            else INSTRUCTION.format(slippery=SLIPPERY if self.is_slippery else "")
        )
        legend = ", ".join(f"{k}: {v}" for k, v in self.vocab)
        moves = f"at most {self.max_actions_per_turn} separated by ||" if self.max_actions_per_turn > 1 else "one"
        self._system = (
            system_prompt
            if system_prompt is not None
            else (
                f"{instruction}\nThe meaning of each symbol in the state is:\n{legend}\n"
                f"Your available actions are:\n{', '.join(ACTIONS)} ({moves} per answer)"
            )
        )
        self.lake: GymFrozenLake | None = None
        self._q: list[list[float]] | None = None

    # ---- gymnasium API -------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """A new lake (or ``options["desc"]``: gymnasium's rows of S/F/H/G). Returns ``([system, user],
        info)``: the rules, then the board; ``info`` has ``state_key`` (the board)."""
        super().reset(seed=seed)
        desc = (options or {}).get("desc")
        if desc is None:
            rng = random.Random(self.map_seed) if self.map_seed is not None else self.task_rng()
            desc = random_lake(rng, self.size, self.p)
        self.lake = GymFrozenLake(desc=list(desc), is_slippery=self.is_slippery)
        self.lake.reset(seed=int(self.np_random.integers(0, 2**31 - 1)))
        self._q = None
        self._steps = self._turns = self._format_errors = self._effective = 0
        self._done = self._truncated = False
        board = self.render()
        user = f"{board}\nYou have {self.max_steps} actions left."
        return (
            [{"role": "system", "content": self._system}, {"role": "user", "content": user}],
            {"state_key": board, "level": board},
        )

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Play one reply's moves in order (stopping on the goal, in a hole or out of steps). Returns the
        new board as one user message, the turn's reward, ``terminated``, ``truncated`` and ``info``."""
        if self.lake is None:
            raise ResetNeeded("call reset() before step()")
        if self._done or self._truncated:
            return (
                [{"role": "user", "content": "The episode is over; call reset() to play again."}],
                0.0,
                self._done,
                self._truncated,
                self._final_info(),
            )
        self._turns += 1
        text = reply_text(action) if isinstance(action, (str, dict)) else ""
        moves, error = parse_moves(text, self.max_actions_per_turn)
        reward = 0.0
        notes = []
        if error is not None:
            self._format_errors += 1
            self._steps += 1
            reward += self.format_penalty
            notes.append(f"Invalid reply: {error}. Nothing moved. Answer like <answer>Right</answer>.")
        for move in moves:
            if self._done or self._steps >= self.max_steps:
                break
            before = int(self.lake.s)
            _, r, terminated, _, _ = self.lake.step(move)
            self._steps += 1
            reward += float(r)
            moved = int(self.lake.s) != before
            self._effective += moved
            notes.append(f"You moved {ACTIONS[move]}" + ("." if moved else ", which had no effect."))
            self._done = bool(terminated)
        self._truncated = not self._done and self._steps >= self.max_steps
        cell = self._cell()
        if cell == "G":
            notes.append("You reached the goal!")
        elif cell == "H":
            notes.append("You fell into a hole. The episode is over.")
        elif self._truncated:
            notes.append("No actions left. The episode is over.")
        board = self.render()
        content = " ".join(notes) + f"\n{board}\nYou have {self.max_steps - self._steps} actions left."
        info: dict[str, Any] = {
            "format_error": error is not None,
            "moves": len(moves),
            "state_key": board,
            "metrics": self._metrics(),
        }
        if self._done or self._truncated:
            info.update(self._final_info())
        return [{"role": "user", "content": content}], reward, self._done, self._truncated, info

    def render(self) -> str | None:
        """The lake as text, one row per line (None before the first reset)."""
        if self.lake is None:
            return None
        player = int(self.lake.s)
        rows = []
        for r, row in enumerate(self.lake.desc):
            chars = []
            for c, cell in enumerate(row):
                kind = {b"H": "hole", b"G": "goal"}.get(bytes(cell), "frozen")
                if r * self.lake.ncol + c == player:
                    kind = {"hole": "player_in_hole", "goal": "player_on_goal"}.get(kind, "player")
                chars.append(self.symbols[kind])
            rows.append("".join(chars))
        return "\n".join(rows)

    def expert_action(self) -> str | None:
        """The expert's reply: on ice that does not slip the next moves of a shortest path to the goal; on
        slippery ice the move with the best chance of reaching it (value iteration). None when the
        episode is over or the goal cannot be reached from here."""
        if self.lake is None:
            raise ResetNeeded("call reset() before expert_action()")
        if self._done or self._truncated:
            return None
        state = int(self.lake.s)
        if not self.is_slippery:
            rows = [b"".join(r).decode() for r in self.lake.desc]
            path = shortest_path(rows, state)
            if not path:
                return None
            moves = path[: self.max_actions_per_turn]
        else:
            if self._q is None:
                self._q = goal_values(self.lake)
            values = self._q[state]
            if max(values) <= 0.0:
                return None
            moves = [max(range(4), key=lambda a: values[a])]
        return "<answer>" + " || ".join(ACTIONS[m] for m in moves) + "</answer>"

    def summarize(self, history: list[Message]) -> str:
        """The summary of turns a ``compact`` context leaves out (``agentgym.rollout.context``): how many
        turns, the moves asked for in them (the board in the latest message shows where they led) and how
        many replies had no readable move."""
        replies = [reply_text(m) for m in history if m.get("role") == "assistant"]
        moves = [parse_moves(text, self.max_actions_per_turn) for text in replies]
        asked = [ACTIONS[a] for found, error in moves if error is None for a in found]
        unreadable = sum(1 for _, error in moves if error is not None)
        text = f"{len(replies)} earlier turns not shown. Moves asked for: {' '.join(asked) or 'none'}."
        return text + (f" {unreadable} replies had no readable move." if unreadable else "")

    def random_action(self, rng: random.Random) -> str:
        """A random policy's reply: ``max_actions_per_turn`` moves drawn uniformly."""
        return "<answer>" + " || ".join(rng.choice(ACTIONS) for _ in range(self.max_actions_per_turn)) + "</answer>"

    # ---- internals -----------------------------------------------------------------------
    def _cell(self) -> str:
        assert self.lake is not None
        r, c = divmod(int(self.lake.s), self.lake.ncol)
        return bytes(self.lake.desc[r][c]).decode()

    def _final_info(self) -> dict[str, Any]:
        success = self._cell() == "G"
        return {"outcome_reward": 1.0 if success else 0.0, "success": success, "metrics": self._metrics()}

    def _metrics(self) -> dict[str, Any]:
        return {
            "actions": self._steps - self._format_errors,
            "effective_actions": self._effective,
            "format_errors": self._format_errors,
            "turns": self._turns,
            "in_hole": float(self._cell() == "H"),
            "on_goal": float(self._cell() == "G"),
        }


def _preset(name: str, size: int, slippery: bool) -> EnvSpec:
    return EnvSpec(
        name=name,
        entry_point=FrozenLakeEnv,
        kwargs={"size": size, "is_slippery": slippery, "max_steps": 20 if size <= 4 else 50},
        description=f"FrozenLake {size}x{size}, {'slippery' if slippery else 'non-slippery'} ice",
    )


FROZENLAKE_4X4 = _preset("frozenlake-4x4", 4, False)
FROZENLAKE_4X4_SLIPPERY = _preset("frozenlake-4x4-slippery", 4, True)
FROZENLAKE_8X8 = _preset("frozenlake-8x8", 8, False)
FROZENLAKE_8X8_SLIPPERY = _preset("frozenlake-8x8-slippery", 8, True)
