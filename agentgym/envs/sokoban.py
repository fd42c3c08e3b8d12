"""Sokoban as a multi-turn text environment.

Each episode is a fresh level from ``sokoban_levels.generate_level`` (same seed, same level;
always solvable). The model sees the board as text and answers with moves:

* text: ``<answer>Up || Left</answer>`` — up to ``max_actions_per_turn`` moves split by
  ``||``, case-insensitive; ``1 2 3 4`` also mean Up Down Left Right. Only the last answer
  tag counts, and only the last ``MAX_REPLY_CHARS`` characters of a reply are read, so a
  long reasoning prefix is fine.
* tools: an assistant message whose ``tool_calls`` call ``move`` with
  ``{"direction": "up"}`` or ``{"direction": ["up", "left"]}`` (schema in ``tools`` and
  ``info["tools"]``). Each call is answered by a ``tool`` message; the last carries the board.

A reply that yields no valid move list (no tag, an unknown word, broken JSON, ...) moves
nothing, costs ``format_penalty`` and one step of the budget, and gets a message saying
what to fix. Nothing a model writes raises.

Expert: ``expert_action()`` is the next reply of a shortest solution from the current board
(at most ``max_actions_per_turn`` moves), so ``agentgym demos`` can write demonstrations.
``offer_tools=False`` leaves the ``move`` tool out of ``info["tools"]`` (the chat template then
renders no tool schema: a much shorter prompt for small models); text answers work either way.

Rewards default to gym-sokoban's: ``penalty_for_step`` per move, ``reward_box_on_target``
/ ``penalty_box_off_target`` when a push changes a box's target status, ``reward_finished``
when the last box lands. A turn's reward is the sum over its moves. ``terminated`` means
solved; ``truncated`` means ``max_steps`` moves were used. The final step's ``info`` has
``outcome_reward`` (1.0 solved, else 0.0) and ``success``; every step's has the episode's
``metrics`` so far, the turn's ``format_error``, ``well_formed`` (one answer, nothing after it, its
moves readable and within the cap), ``format_reward`` (0 when well formed, else -1: a reward a trainer
may train on, ``algorithm.turn_reward_from=format_reward``, without changing the feedback text that
shows the move rewards), ``moves`` and the board as ``state_key``.
"""

from __future__ import annotations

import json
import random
from typing import Any, ClassVar

from gymnasium.error import ResetNeeded

from agentgym.envs.answer_tag import last_answer
from agentgym.envs.base import TextEnv, reply_text
from agentgym.envs.sokoban_levels import DIRECTIONS, Level, generate_level, shortest_moves, solve
from agentgym.registry import EnvSpec
from agentgym.types import Action, Message

SYSTEM_PROMPT = (
    "You are playing Sokoban. Push every box X onto a target O (you push, never pull). "
    "Symbols: # wall, _ floor, P you, √ box on target, S you on target. "
    "Answer like <answer>Up || Left</answer>: at most {max_moves} moves of Up, Down, Left, Right."
)
"""The rules message (``{max_moves}``: ``max_actions_per_turn``). Kept short: with a small model
every prompt token is paid for in every episode."""

GRID_PROMPT = (
    "You are playing Sokoban. Push every box onto a target (you push, never pull). "
    "The meaning of each symbol in the state is: {legend}. "
    "Answer like <answer>Up || Left</answer>: at most {max_moves} moves of Up, Down, Left, Right."
)
"""The rules message when ``grid_lookup`` / ``grid_vocab`` name other symbols (ROLL's GridVocab Sokoban)."""

CELLS = ("#", "_", "O", "√", "X", "P", "S")
"""The board's own symbols in ROLL's cell-id order (``grid_lookup`` keys 0..6): wall, floor, target, box on
target, box, player, player on target."""
CELL_MEANINGS = ("wall", "empty", "target", "box on target", "box", "player", "player on target")

MAX_REPLY_CHARS = 8192
"""Only this many trailing characters of a reply (or of a tool call's arguments) are read."""

_MOVE_WORDS = {"up": 0, "down": 1, "left": 2, "right": 3, "1": 0, "2": 1, "3": 2, "4": 3}

_MOVED = DIRECTIONS
_PUSHED = tuple(f"{d} (push)" for d in DIRECTIONS)
_BLOCKED = tuple(f"{d} (blocked)" for d in DIRECTIONS)

# Board text -> one byte per character, for the fixed and the moving parts of the board.
_WALL_BYTES = str.maketrans(
    {"#": "\x01", "\n": "\x01", "_": "\x00", "O": "\x00", "X": "\x00", "√": "\x00", "P": "\x00", "S": "\x00"}
)
_TARGET_BYTES = str.maketrans(
    {"#": "\x00", "\n": "\x00", "_": "\x00", "O": "\x01", "X": "\x00", "√": "\x01", "P": "\x00", "S": "\x01"}
)
_BOX_BYTES = str.maketrans(
    {"#": "\x00", "\n": "\x00", "_": "\x00", "O": "\x00", "X": "\x01", "√": "\x01", "P": "\x00", "S": "\x00"}
)


def legend_pairs(grid_vocab: Any) -> list[tuple[str, str]]:
    """ROLL's ``grid_vocab`` (symbol -> meaning) as pairs; also given as a list of ``[symbol, meaning]`` pairs,
    the form a config carries it in (a symbol such as ``.`` cannot be a config key)."""
    if not grid_vocab:
        return []
    items = grid_vocab.items() if isinstance(grid_vocab, dict) else grid_vocab
    return [(str(symbol), str(meaning)) for symbol, meaning in items]


def move_tool() -> dict[str, Any]:
    """The OpenAI function schema of the ``move`` tool (a new dict on every call)."""
    direction = {"type": "string", "enum": ["up", "down", "left", "right"]}
    return {
        "type": "function",
        "function": {
            "name": "move",
            "description": "Move the player; walking into a box pushes it. A list of directions runs in order.",
            "parameters": {
                "type": "object",
                "properties": {
                    "direction": {"anyOf": [direction, {"type": "array", "items": dict(direction)}]},
                },
                "required": ["direction"],
            },
        },
    }


def parse_answer(text: str, max_moves: int) -> tuple[list[int], str | None, bool]:
    """Read the moves from the last ``<answer>...</answer>`` in ``text``.

    Returns ``(moves, error, cut)``: direction indices (0 Up, 1 Down, 2 Left, 3 Right);
    ``error`` is None or says what is wrong (then ``moves`` is empty); ``cut`` is True when
    moves past ``max_moves`` were dropped.
    """
    if len(text) > MAX_REPLY_CHARS:
        text = text[-MAX_REPLY_CHARS:]
    if not text or text.isspace():
        return [], "the reply was empty", False
    answer = last_answer(text)
    if answer is None:
        return [], "no <answer>...</answer> found", False
    return _words_to_moves(answer.split("||", max_moves), max_moves)


def is_lone_answer(text: str) -> bool:
    """Whether a reply is one answer and nothing after it: exactly one ``<answer>`` and one
    ``</answer>``, the reply ending with the latter (``info["well_formed"]`` also needs its moves to
    parse and fit ``max_actions_per_turn``). ``parse_answer`` is more forgiving: it reads the last
    answer of any reply, so a policy can drift into doubled tags or trailing text that still plays."""
    lowered = text.lower()
    return lowered.rstrip().endswith("</answer>") and lowered.count("<answer>") == 1 and lowered.count("</answer>") == 1


def parse_tool_calls(calls: Any, max_moves: int) -> tuple[list[int], str | None, bool]:
    """Read the moves from OpenAI ``tool_calls`` naming ``move``; same return as ``parse_answer``."""
    if not isinstance(calls, list):
        return [], "tool_calls must be a list", False
    words: list[Any] = []
    for n, call in enumerate(calls, 1):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            return [], f"tool call {n} has no function", False
        if function.get("name") != "move":
            return [], f"tool call {n}: unknown tool {_shown(function.get('name'), 40)}; the tool is 'move'", False
        args = function.get("arguments")
        if isinstance(args, str):
            if len(args) > MAX_REPLY_CHARS:
                return [], f"tool call {n}: arguments too long", False
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):  # RecursionError: nested too deeply
                return [], f"tool call {n}: arguments are not valid JSON", False
        direction = args.get("direction", args.get("directions")) if isinstance(args, dict) else None
        if isinstance(direction, str):
            words.append(direction)
        elif isinstance(direction, list) and direction:
            words.extend(direction[: max_moves + 1])
        else:
            return [], f'tool call {n}: expected {{"direction": "up"}} or a list of directions', False
        if len(words) > max_moves:
            break
    if not words:
        return [], "no tool calls", False
    return _words_to_moves(words, max_moves)


def _words_to_moves(words: list[Any], max_moves: int) -> tuple[list[int], str | None, bool]:
    words = [w for w in words if not (isinstance(w, str) and (not w or w.isspace()))]
    if not words:
        return [], "the answer had no moves", False
    moves = []
    for word in words[:max_moves]:
        move = _MOVE_WORDS.get(word.strip().lower()) if isinstance(word, str) else None
        if move is None:
            return [], f"{_shown(word, 20)} is not a move", False
        moves.append(move)
    return moves, None, len(words) > max_moves


def _shown(value: Any, limit: int) -> str:
    """A short quote of a value the model sent: text as text, anything else by its type (the
    ``str`` of a deeply nested list or a huge integer raises)."""
    return repr(value.strip()[:limit]) if isinstance(value, str) else f"a JSON {type(value).__name__}"


class SokobanEnv(TextEnv):
    """Sokoban: push every box onto a target (default 6x6 room, 1 box; generated, always solvable).

    ``dim_room`` is (rows, cols) including the wall ring; ``num_boxes`` boxes; ``max_steps``
    moves per episode (an unreadable reply counts as one); ``search_depth`` (pulls per path)
    and ``max_search_nodes`` (states per room) bound the reverse-play generator. The plain ``sokoban`` env is 6x6
    with one box, the size
    small models learn on; presets ``sokoban-6x6-2``, ``sokoban-8x8-2`` and
    ``sokoban-10x10-3`` are harder. ``reset(options={"level": Level or text})`` plays a
    given board instead of a generated one. ``offer_tools`` offers the ``move`` tool in
    ``info["tools"]`` (default); ``system_prompt`` replaces the rules message (``{max_moves}``
    is filled in). ``strict_format`` plays only well-formed text replies (``info["well_formed"]``):
    anything else (a doubled tag, text after the answer, more moves than the cap) is a format error.
    ``grid_lookup`` (ROLL's cell ids 0..6 -> the symbols shown) and ``grid_vocab`` (symbol -> meaning, the
    legend in the rules message) draw the board in other symbols, as ROLL's GridVocab Sokoban does.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}
    tools: ClassVar[list[dict[str, Any]]] = [move_tool()]

    def __init__(
        self,
        dim_room: tuple[int, int] | list[int] = (6, 6),
        num_boxes: int = 1,
        max_steps: int = 100,
        search_depth: int = 100,
        max_actions_per_turn: int = 5,
        penalty_for_step: float = -0.1,
        reward_box_on_target: float = 1.0,
        penalty_box_off_target: float = -1.0,
        reward_finished: float = 10.0,
        format_penalty: float = -0.1,
        max_search_nodes: int | None = None,
        offer_tools: bool = True,
        system_prompt: str | None = None,
        strict_format: bool = False,
        grid_lookup: dict[Any, str] | None = None,
        grid_vocab: Any = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        height, width = (int(x) for x in dim_room)
        if max_steps < 1 or max_actions_per_turn < 1:
            raise ValueError("max_steps and max_actions_per_turn must be at least 1")
        self.dim_room = (height, width)
        self.num_boxes = int(num_boxes)
        self.max_steps = int(max_steps)
        self.search_depth = int(search_depth)
        self.max_search_nodes = max_search_nodes
        self.max_actions_per_turn = int(max_actions_per_turn)
        self.penalty_for_step = float(penalty_for_step)
        self.reward_box_on_target = float(reward_box_on_target)
        self.penalty_box_off_target = float(penalty_box_off_target)
        self.reward_finished = float(reward_finished)
        self.format_penalty = float(format_penalty)
        self.level: Level | None = None
        self._chars: list[str] | None = None
        self.offer_tools = bool(offer_tools)
        self.strict_format = bool(strict_format)
        symbols = list(CELLS)
        for key, symbol in (grid_lookup or {}).items():  # ROLL: {0: "W", 1: ".", 2: "G", ...}
            if not 0 <= int(key) < len(CELLS):
                raise ValueError(f"grid_lookup keys are ROLL's cell ids 0..6, got {key!r}")
            symbols[int(key)] = str(symbol)
        self._shown_table = str.maketrans(dict(zip(CELLS, symbols))) if symbols != list(CELLS) else None
        prompt = SYSTEM_PROMPT if system_prompt is None else system_prompt
        if system_prompt is None and (grid_lookup or grid_vocab):
            vocab = legend_pairs(grid_vocab) or list(zip(symbols, CELL_MEANINGS))
            prompt = GRID_PROMPT.replace(
                "{legend}", ", ".join(f"{k}: {v}" for k, v in vocab).replace("{", "{{").replace("}", "}}")
            )
        self._system = prompt.format(max_moves=self.max_actions_per_turn)
        self._plans: dict[tuple[int, tuple[int, ...]], list[str]] = {}

    # ---- gymnasium API -------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on a new level (or ``options["level"]``).

        Returns ``([system, user], info)``: the rules, then the board. ``info`` has
        ``tools`` (the ``move`` schema, unless ``offer_tools=False``), ``level`` (the board
        text) and ``num_boxes``.
        """
        super().reset(seed=seed)
        level = (options or {}).get("level")
        if level is None:
            level = generate_level(
                self.task_rng(), self.dim_room, self.num_boxes, self.search_depth, self.max_search_nodes
            )
        elif isinstance(level, str):
            level = Level.from_text(level)
        elif not isinstance(level, Level):
            raise TypeError(f"options['level'] must be a Level or board text, got {type(level).__name__}")
        self._load(level)
        board = self._board
        user = f"Boxes: {self._num_boxes}. Moves left: {self.max_steps}.\n{self._shown(board)}"
        info: dict[str, Any] = {"level": self._shown(board), "num_boxes": self._num_boxes, "state_key": board}
        if self.offer_tools:
            info["tools"] = [move_tool()]
        return [{"role": "system", "content": self._system}, {"role": "user", "content": user}], info

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Play one reply: its moves in order, stopping early when solved or out of steps.

        Returns ``(messages, reward, terminated, truncated, info)``; ``messages`` is one user
        message (or, for tool calls, one tool message per call) ending with the board.
        """
        if self._chars is None:
            raise ResetNeeded("call reset() before step()")
        if self._terminated or self._truncated:
            return (
                [{"role": "user", "content": "The episode is over; call reset() to play again."}],
                0.0,
                self._terminated,
                self._truncated,
                self._final_info(),
            )
        self._turns += 1
        calls = action.get("tool_calls") if isinstance(action, dict) else None
        lone_answer = False
        if calls is not None and not (isinstance(calls, list) and not calls):
            moves, error, cut = parse_tool_calls(calls, self.max_actions_per_turn)
            lone_answer = True
        elif isinstance(action, (str, dict)):
            text = _text_of(action)
            moves, error, cut = parse_answer(text, self.max_actions_per_turn)
            lone_answer = is_lone_answer(text)
            if self.strict_format and error is None and not (lone_answer and not cut):
                moves, error = (
                    [],
                    (
                        f"write exactly one <answer>...</answer> of at most {self.max_actions_per_turn} "
                        "moves and nothing after it"
                    ),
                )
        else:
            moves, error, cut = [], f"a reply is text or a message dict, not {type(action).__name__}", False
        well_formed = error is None and not cut and lone_answer
        if error is None:
            reward, text = self._play(moves, cut)
        else:
            reward, text = self._reject(error)
        terminated = self._on_target == self._num_boxes
        truncated = not terminated and self._steps >= self.max_steps
        self._terminated, self._truncated = terminated, truncated
        if terminated:
            text += "\nSolved! Every box is on a target."
        elif truncated:
            text += "\nNo moves left. The episode is over."
        info: dict[str, Any] = {
            "format_error": error is not None,
            "well_formed": well_formed,
            "format_reward": 0.0 if well_formed else -1.0,
            "moves": len(moves),
            "boxes_on_target": self._on_target,
            "state_key": "".join(self._chars or ()),
            "metrics": self._episode_metrics(),
        }
        if terminated or truncated:
            info.update(self._final_info())
        return _reply_messages(calls, text, error is None), reward, terminated, truncated, info

    def render(self) -> str | None:
        """The board as text, one row per line (None before the first reset)."""
        return self._shown(self._board) if self._chars is not None else None

    def _shown(self, board: str) -> str:
        """The board in the symbols the model is shown (``grid_lookup``)."""
        return board.translate(self._shown_table) if self._shown_table is not None else board

    def expert_action(self) -> str | None:
        """The expert's reply to the current board: the next ``max_actions_per_turn`` moves of a
        shortest solution (``shortest_moves``; the push-optimal ``solve`` where the room is too
        big for it), as ``<answer>Up || Left</answer>``. None when the episode is over or no
        solution is left (a box was pushed where no target can be reached). A plan is computed
        once and followed while the board stays on it."""
        if self._chars is None:
            raise ResetNeeded("call reset() before expert_action()")
        if self._terminated or self._truncated:
            return None
        level = self.current_level()
        key = (level.player, level.boxes)
        plan = self._plans.get(key)
        if plan is None:
            try:
                moves = shortest_moves(level)
            except RuntimeError:
                moves = solve(level)
            if not moves:
                return None
            self._plans = _plan_suffixes(level, moves)
            plan = self._plans[key]
        return "<answer>" + " || ".join(plan[: self.max_actions_per_turn]) + "</answer>"

    def random_action(self, rng: random.Random) -> str:
        """A random policy's reply: ``max_actions_per_turn`` moves drawn uniformly (the held-out
        table's floor)."""
        return "<answer>" + " || ".join(rng.choice(DIRECTIONS) for _ in range(self.max_actions_per_turn)) + "</answer>"

    def current_level(self) -> Level:
        """The board as it stands now (boxes and player where play has put them)."""
        if self._chars is None or self.level is None:
            raise ResetNeeded("call reset() before current_level()")
        level, stride = self.level, self.level.width + 1
        boxes = tuple(sorted(i - i // stride for i, b in enumerate(self._box) if b))
        return Level(
            level.height, level.width, level.walls, level.targets, boxes, self._player - self._player // stride
        )

    # ---- internals -----------------------------------------------------------------------
    def _load(self, level: Level) -> None:
        """Set up the playing state. Cells use a row stride of ``width + 1`` so that the board
        text (newlines included) doubles as the grid: ``_chars`` *is* the rendering."""
        text = level.text()
        self.level = level
        self._board = text
        self._chars = list(text)
        self._wall = text.translate(_WALL_BYTES).encode() + b"\x01"
        self._target = text.translate(_TARGET_BYTES).encode() + b"\x00"
        self._box = bytearray(text.translate(_BOX_BYTES).encode() + b"\x00")
        stride = level.width + 1
        self._offsets = (-stride, stride, -1, 1)
        self._player = level.player + level.player // level.width
        self._num_boxes = len(level.boxes)
        self._on_target = len(set(level.boxes) & set(level.targets))
        self._steps = self._turns = self._pushes = self._blocked = self._format_errors = 0
        self._terminated = self._truncated = False
        self._plans = {}

    def _play(self, moves: list[int], cut: bool) -> tuple[float, str]:
        chars, wall, box, target, offsets = self._chars, self._wall, self._box, self._target, self._offsets
        assert chars is not None
        p, on, steps = self._player, self._on_target, self._steps
        reward = 0.0
        notes = []
        for move in moves:
            if on == self._num_boxes or steps >= self.max_steps:
                break
            steps += 1
            reward += self.penalty_for_step
            off = offsets[move]
            nxt = p + off
            if wall[nxt]:
                self._blocked += 1
                notes.append(_BLOCKED[move])
                continue
            if box[nxt]:
                beyond = nxt + off
                if wall[beyond] or box[beyond]:
                    self._blocked += 1
                    notes.append(_BLOCKED[move])
                    continue
                box[nxt] = 0
                box[beyond] = 1
                self._pushes += 1
                if target[nxt]:
                    on -= 1
                    reward += self.penalty_box_off_target
                if target[beyond]:
                    on += 1
                    reward += self.reward_box_on_target
                    chars[beyond] = "√"
                else:
                    chars[beyond] = "X"
                notes.append(_PUSHED[move])
            else:
                notes.append(_MOVED[move])
            chars[p] = "O" if target[p] else "_"
            chars[nxt] = "S" if target[nxt] else "P"
            p = nxt
        if on == self._num_boxes and self._on_target != on:
            reward += self.reward_finished
        self._player, self._on_target, self._steps = p, on, steps
        self._board = board = "".join(chars)
        head = f"Only the first {self.max_actions_per_turn} moves were used. " if cut else ""
        return reward, (
            f"{head}Moves: {', '.join(notes) or 'none'}. Reward: {reward:+g}. "
            f"Boxes on targets: {on}/{self._num_boxes}. Moves left: {self.max_steps - steps}.\n"
            f"{self._shown(board)}"
        )

    def _reject(self, error: str) -> tuple[float, str]:
        self._format_errors += 1
        self._steps += 1
        return self.format_penalty, (
            f"Invalid reply: {error}. Nothing moved. Reward: {self.format_penalty:+g}. "
            f"Answer like <answer>Up || Left</answer> (Up, Down, Left, Right; at most "
            f"{self.max_actions_per_turn}). Moves left: {self.max_steps - self._steps}.\n{self._shown(self._board)}"
        )

    def _final_info(self) -> dict[str, Any]:
        success = self._terminated
        return {"outcome_reward": 1.0 if success else 0.0, "success": success, "metrics": self._episode_metrics()}

    def _episode_metrics(self) -> dict[str, Any]:
        """The episode so far: in every step's ``info``, so an episode the runner stops at its turn
        limit is counted like one that ended."""
        return {
            "boxes_on_target": self._on_target,
            "num_boxes": self._num_boxes,
            "actions": self._steps - self._format_errors,
            "pushes": self._pushes,
            "blocked_moves": self._blocked,
            "format_errors": self._format_errors,
            "turns": self._turns,
        }


def _plan_suffixes(level: Level, moves: list[str]) -> dict[tuple[int, tuple[int, ...]], list[str]]:
    """(player, boxes) of every state along ``moves`` -> the moves left from there."""
    offsets = dict(zip(DIRECTIONS, (-level.width, level.width, -1, 1)))
    player, boxes = level.player, set(level.boxes)
    plans = {(player, level.boxes): moves}
    for i, move in enumerate(moves):
        off = offsets[move]
        to = player + off
        if to in level.walls or (to in boxes and (to + off in level.walls or to + off in boxes)):
            continue  # a blocked move leaves the state as it was (never in a solver's plan)
        if to in boxes:
            boxes.remove(to)
            boxes.add(to + off)
        player = to
        plans[(player, tuple(sorted(boxes)))] = moves[i + 1 :]
    return plans


def _text_of(action: str | dict[str, Any]) -> str:
    """The reply's text; content parts that are not text count as no text."""
    try:
        return reply_text(action)
    except (TypeError, AttributeError):
        return ""


def _reply_messages(calls: Any, text: str, ran: bool) -> list[Message]:
    """The step's observation: one user message, or one tool message per tool call (the
    last one carries the full feedback) so every call in the assistant message is answered."""
    if not isinstance(calls, list) or not calls:
        return [{"role": "user", "content": text}]
    out: list[Message] = []
    for call in calls[:-1]:
        out.append({"role": "tool", "tool_call_id": _call_id(call), "content": "ok" if ran else "not run"})
    out.append({"role": "tool", "tool_call_id": _call_id(calls[-1]), "content": text})
    return out


def _call_id(call: Any) -> str:
    call_id = call.get("id") if isinstance(call, dict) else None
    return call_id if isinstance(call_id, str) else ""


def _preset(name: str, rows: int, cols: int, boxes: int) -> EnvSpec:
    return EnvSpec(
        name=name,
        entry_point=SokobanEnv,
        kwargs={"dim_room": (rows, cols), "num_boxes": boxes},
        description=f"Sokoban {rows}x{cols}, {boxes} box{'es' if boxes > 1 else ''}",
    )


SOKOBAN_6X6_1 = _preset("sokoban-6x6-1", 6, 6, 1)
SOKOBAN_6X6_2 = _preset("sokoban-6x6-2", 6, 6, 2)
SOKOBAN_8X8_2 = _preset("sokoban-8x8-2", 8, 8, 2)
SOKOBAN_10X10_3 = _preset("sokoban-10x10-3", 10, 10, 3)
