"""Sokoban boards: the ``Level`` type, procedural generation by reverse play, and solvers.

Generation follows gym-sokoban (Schrader, after DeepMind's I2A paper): carve a room by a
random walk, put the targets and the player on its floor, start every box on a target and
*pull* boxes away with reverse moves, keeping the reachable state with the best score
``box_swaps * total box displacement`` (zero while any box still sits on a target). Every
reverse pull is a forward push backwards, so each level handed out is solvable by
construction; ``solve`` proves it independently (push-optimal, fast on any room) and
``shortest_moves`` finds a move-optimal solution (the expert's plan; small rooms).

gym-sokoban searches single player steps and can visit 300,000 states per room. Here the
search runs over *pulls*: a state is the box positions plus the region the player can walk
to, so walking is one flood fill (bit operations on a Python int) instead of a search
branch, and a node budget bounds the work. That keeps a 6x6 room well under a millisecond.

Cells are flat indices ``row * width + col``. Walls surround every generated room.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

DIRECTIONS = ("Up", "Down", "Left", "Right")

# Room-carving masks of gym-sokoban, as (row, col) offsets from the walk position.
_MASKS = (
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, -1), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
)
_WALK_DIRECTIONS = ((1, 0), (0, 1), (-1, 0), (0, -1))

# Input symbols: ours, plus the classic XSB ones so published levels load as they are.
_SYMBOLS = {
    "#": "#",
    "_": "_",
    "O": "O",
    "X": "X",
    "√": "√",
    "P": "P",
    "S": "S",
    " ": "_",
    "-": "_",
    ".": "O",
    "$": "X",
    "*": "√",
    "@": "P",
    "+": "S",
}


@dataclass(frozen=True)
class Level:
    """A Sokoban board: ``walls`` (a set), ``targets`` and ``boxes`` (sorted tuples) hold flat
    cell indices (``row * width + col``); ``player`` is one. Every other cell is floor."""

    height: int
    width: int
    walls: frozenset[int]
    targets: tuple[int, ...]
    boxes: tuple[int, ...]
    player: int

    @property
    def solved(self) -> bool:
        return set(self.boxes) == set(self.targets)

    def text(self) -> str:
        """The board, one row per line: ``#`` wall, ``_`` floor, ``O`` target, ``X`` box,
        ``√`` box on target, ``P`` player, ``S`` player on target."""
        grid = ["_"] * (self.height * self.width)
        for cell in self.walls:
            grid[cell] = "#"
        for cell in self.targets:
            grid[cell] = "O"
        for cell in self.boxes:
            grid[cell] = "√" if grid[cell] == "O" else "X"
        grid[self.player] = "S" if grid[self.player] == "O" else "P"
        w = self.width
        return "\n".join("".join(grid[r * w : (r + 1) * w]) for r in range(self.height))

    @classmethod
    def from_text(cls, text: str) -> Level:
        """Parse a board drawn with ``Level.text``'s symbols (or classic XSB: ``# $ . * @ +``
        and space). Short rows are padded with walls and every cell out of the player's reach
        becomes wall. Raises ``ValueError`` on a board that is not playable: no player or two,
        boxes and targets that differ in number, floor the player can walk off the edge of, or
        a box or target the player cannot reach."""
        rows = [row for row in text.strip("\n").split("\n") if row.strip()]
        if not rows:
            raise ValueError("empty Sokoban board")
        width = max(len(row) for row in rows)
        walls, targets, boxes, players = set(), [], [], []
        for r, row in enumerate(rows):
            for c, raw in enumerate(row.ljust(width, "#")):
                symbol = _SYMBOLS.get(raw)
                if symbol is None:
                    raise ValueError(f"unknown symbol {raw!r} at row {r}, column {c}")
                cell = r * width + c
                if symbol == "#":
                    walls.add(cell)
                if symbol in "O√S":
                    targets.append(cell)
                if symbol in "X√":
                    boxes.append(cell)
                if symbol in "PS":
                    players.append(cell)
        if len(players) != 1:
            raise ValueError(f"a board needs exactly one player (P or S), found {len(players)}")
        if not boxes or len(boxes) != len(targets):
            raise ValueError(
                f"a board needs as many targets as boxes (at least one): {len(boxes)} boxes, {len(targets)} targets"
            )
        height, player = len(rows), players[0]
        area = _walkable(height, width, walls, player)
        for what, cells in (("box", boxes), ("target", targets)):
            for cell in cells:
                if cell not in area:
                    raise ValueError(
                        f"the {what} at row {cell // width}, column {cell % width} is out of the player's reach"
                    )
        # Whatever the player cannot reach is wall: the board is then closed by construction.
        walls = set(range(height * width)) - area
        return cls(height, width, frozenset(walls), tuple(targets), tuple(boxes), player)


def _walkable(height: int, width: int, walls: set[int], player: int) -> set[int]:
    """The cells the player can walk to with boxes ignored. Raises ``ValueError`` if that
    reaches the outer ring of the board (the floor is not closed by walls)."""
    seen, todo = {player}, [player]
    while todo:
        cell = todo.pop()
        r, c = divmod(cell, width)
        if r in (0, height - 1) or c in (0, width - 1):
            raise ValueError(
                f"the player can walk to the edge of the board (row {r}, column {c}): surround the floor with walls"
            )
        for nxt in (cell - width, cell + width, cell - 1, cell + 1):
            if nxt not in seen and nxt not in walls:
                seen.add(nxt)
                todo.append(nxt)
    return seen


# ---- generation ------------------------------------------------------------------------


def generate_level(
    rng: random.Random,
    dim_room: tuple[int, int] = (6, 6),
    num_boxes: int = 1,
    search_depth: int = 100,
    max_search_nodes: int | None = None,
    p_change_directions: float = 0.35,
    num_steps: int | None = None,
    max_tries: int = 200,
) -> Level:
    """A solvable level drawn from ``rng`` (same rng state, same level).

    ``dim_room`` is ``(rows, cols)`` including the wall ring; ``search_depth`` bounds the
    pulls on one reverse-play path and ``max_search_nodes`` (default ``100 * num_boxes``)
    the states examined per room. A room whose best state leaves a box on a target is
    rejected and another drawn from the same rng, up to ``max_tries`` rooms.
    """
    height, width = dim_room
    if height < 3 or width < 3:
        raise ValueError(f"dim_room must be at least (3, 3), got {dim_room}")
    if num_boxes < 1:
        raise ValueError(f"num_boxes must be at least 1, got {num_boxes}")
    steps = int(1.7 * (height + width)) if num_steps is None else num_steps
    budget = 100 * num_boxes if max_search_nodes is None else max_search_nodes
    for _ in range(max_tries):
        floor = room_topology(rng, height, width, p_change_directions, steps)
        cells = [i for i in range(height * width) if floor >> i & 1]
        if len(cells) < num_boxes + 2:
            continue
        picks = rng.sample(cells, num_boxes + 1)
        targets = tuple(sorted(picks[1:]))
        score, boxes, player = reverse_play(floor, width, targets, picks[0], search_depth, budget, rng)
        if score > 0:
            walls = frozenset(i for i in range(height * width) if not floor >> i & 1)
            return Level(height, width, walls, targets, tuple(sorted(boxes)), player)
    raise RuntimeError(
        f"no playable {height}x{width} room with {num_boxes} boxes after {max_tries} tries: "
        "use a larger dim_room or fewer boxes"
    )


def room_topology(rng: random.Random, height: int, width: int, p_change_directions: float, num_steps: int) -> int:
    """gym-sokoban's room carving: a random walk stamping small floor masks. Returns the
    floor as a bit mask over flat cells (bit ``row * width + col``), outer ring all wall."""
    floor = bytearray(height * width)
    random_ = rng.random  # int(random_() * n) draws faster than randrange(n) in this hot loop
    dr, dc = _WALK_DIRECTIONS[rng.getrandbits(2)]
    r = 1 + int(random_() * (height - 1))
    c = 1 + int(random_() * (width - 1))
    for _ in range(num_steps):
        if random_() < p_change_directions:
            dr, dc = _WALK_DIRECTIONS[rng.getrandbits(2)]
        r += dr
        r = 1 if r < 1 else height - 2 if r > height - 2 else r
        c += dc
        c = 1 if c < 1 else width - 2 if c > width - 2 else c
        for mr, mc in _MASKS[int(random_() * 5)]:
            floor[(r + mr) * width + c + mc] = 1
    mask = 0
    for row in range(1, height - 1):
        base = row * width
        for col in range(1, width - 1):
            if floor[base + col]:
                mask |= 1 << (base + col)
    return mask


def reverse_play(
    floor: int, width: int, targets: tuple[int, ...], player: int, search_depth: int, max_nodes: int, rng: random.Random
) -> tuple[int, tuple[int, ...], int]:
    """Pull boxes off their targets by a depth-first search over reverse moves.

    Boxes start on ``targets`` (box ``i`` belongs to ``targets[i]``). Returns the best
    ``(score, boxes, player)`` seen; score is ``box_swaps * displacement`` (gym-sokoban's),
    where ``box_swaps`` counts changes of the pulled box and ``displacement`` sums each box's
    Manhattan distance from its target, and is 0 while any box stands on any target.
    """
    offsets = (-width, width, -1, 1)
    target_mask = 0
    for t in targets:
        target_mask |= 1 << t
    best: tuple[int, tuple[int, ...], int] = (0, targets, player)
    seen: set[tuple[tuple[int, ...], int]] = set()
    # (player, boxes, box mask, index of the last pulled box, box swaps, pulls so far)
    stack = [(player, targets, target_mask, -1, 0, 0)]
    nodes = 0
    while stack and nodes < max_nodes:
        p, boxes, box_mask, last, swaps, depth = stack.pop()
        free = floor & ~box_mask
        region = 1 << p
        while True:  # flood fill: every cell the player can walk to
            grown = region | ((region << 1 | region >> 1 | region << width | region >> width) & free)
            if grown == region:
                break
            region = grown
        key = (boxes, region)
        if key in seen:
            continue
        seen.add(key)
        nodes += 1
        if swaps and not box_mask & target_mask:
            displacement = 0
            for b, t in zip(boxes, targets):
                br, bc = divmod(b, width)
                tr, tc = divmod(t, width)
                displacement += abs(br - tr) + abs(bc - tc)
            if swaps * displacement > best[0]:
                best = (swaps * displacement, boxes, p)
        if depth >= search_depth:
            continue
        children = []
        for i, b in enumerate(boxes):
            for off in offsets:
                stand = b + off  # the player stands here, pulls, and steps back to stand + off
                if region >> stand & 1 and free >> (stand + off) & 1:
                    children.append(
                        (
                            stand + off,
                            boxes[:i] + (stand,) + boxes[i + 1 :],
                            box_mask ^ (1 << b) ^ (1 << stand),
                            i,
                            swaps + (i != last),
                            depth + 1,
                        )
                    )
        rng.shuffle(children)
        stack.extend(children)
    return best


# ---- solving ---------------------------------------------------------------------------


def _floor_mask(level: Level) -> int:
    """Every cell that is not a wall, one bit per cell."""
    return sum(1 << i for i in range(level.height * level.width) if i not in level.walls)


def solve(level: Level, max_states: int = 1_000_000) -> list[str] | None:
    """A push-optimal solution as direction names (``["Up", "Left", ...]``), or None when
    the level has none. Breadth-first over pushes; boxes on cells from which no push
    sequence reaches a target are pruned. Raises ``RuntimeError`` past ``max_states``."""
    w = level.width
    offsets = (-w, w, -1, 1)
    floor = _floor_mask(level)
    goal = _mask(level.targets)
    start = _mask(level.boxes)
    if start == goal:
        return []
    live = _live_cells(floor, level.targets, offsets)
    start_key = (start, _region(floor & ~start, level.player, w))
    # key -> (parent key, boxes before, player before, pushed box, direction); None at the start
    parents: dict[tuple[int, int], tuple | None] = {start_key: None}
    queue = deque([(start, level.player, start_key)])
    while queue:
        boxes, player, key = queue.popleft()
        region = key[1]
        free = floor & ~boxes
        rest = boxes
        while rest:
            low = rest & -rest
            b = low.bit_length() - 1
            rest ^= low
            for d, off in enumerate(offsets):
                to = b + off
                if not (region >> (b - off) & 1 and free >> to & 1 and live >> to & 1):
                    continue
                new = boxes ^ low ^ (1 << to)
                new_key = (new, _region(floor & ~new, b, w))
                if new_key in parents:
                    continue
                parents[new_key] = (key, boxes, player, b, d)
                if new == goal:
                    return _unwind(parents, new_key, floor, w)
                if len(parents) > max_states:
                    raise RuntimeError(f"solve gave up after {max_states} states; raise max_states")
                queue.append((new, b, new_key))
    return None


def _mask(cells: tuple[int, ...]) -> int:
    out = 0
    for cell in cells:
        out |= 1 << cell
    return out


def _region(free: int, player: int, width: int) -> int:
    """Bit mask of the cells reachable from ``player`` through ``free`` cells."""
    region = 1 << player
    while True:
        grown = region | ((region << 1 | region >> 1 | region << width | region >> width) & free)
        if grown == region:
            return region
        region = grown


def _live_cells(floor: int, targets: tuple[int, ...], offsets: tuple[int, ...]) -> int:
    """Cells from which a lone box can be pushed onto some target (pull back from targets)."""
    live = _mask(targets)
    todo = list(targets)
    while todo:
        cell = todo.pop()
        for off in offsets:
            before, stand = cell - off, cell - 2 * off
            if not live >> before & 1 and floor >> before & 1 and floor >> stand & 1:
                live |= 1 << before
                todo.append(before)
    return live


def _unwind(parents: dict, key: tuple[int, int], floor: int, width: int) -> list[str]:
    """Turn the chain of pushes ending at ``key`` into single steps, walks included."""
    pushes = []
    while parents[key] is not None:
        key, boxes, player, box, d = parents[key]
        pushes.append((boxes, player, box, d))
    offsets = (-width, width, -1, 1)
    moves: list[str] = []
    for boxes, player, box, d in reversed(pushes):
        moves.extend(_walk(floor & ~boxes, player, box - offsets[d], width))
        moves.append(DIRECTIONS[d])
    return moves


def _walk(free: int, start: int, goal: int, width: int) -> list[str]:
    """Shortest walk from ``start`` to ``goal`` through ``free`` cells, as direction names."""
    offsets = (-width, width, -1, 1)
    came = {start: None}
    todo = deque([start])
    while todo:
        cell = todo.popleft()
        if cell == goal:
            break
        for d, off in enumerate(offsets):
            nxt = cell + off
            if nxt not in came and free >> nxt & 1:
                came[nxt] = (cell, d)
                todo.append(nxt)
    path = []
    cell = goal
    while came[cell] is not None:
        cell, d = came[cell]
        path.append(DIRECTIONS[d])
    return path[::-1]


def shortest_moves(level: Level, max_states: int = 200_000) -> list[str] | None:
    """A solution with the fewest moves (walks included), as direction names, or None when the
    level has none. Breadth-first over (player, boxes) states, trying Up, Down, Left, Right in
    that order, so the same board always gets the same plan; boxes pushed onto cells from
    which no target can be reached are pruned. Raises ``RuntimeError`` past ``max_states``
    (then ``solve``, which searches pushes only, still copes)."""
    w = level.width
    offsets = (-w, w, -1, 1)
    floor = _floor_mask(level)
    goal = _mask(level.targets)
    start = (level.player, _mask(level.boxes))
    if start[1] == goal:
        return []
    live = _live_cells(floor, level.targets, offsets)
    # state -> (previous state, direction); None at the start
    parents: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        player, boxes = state
        for d, off in enumerate(offsets):
            to = player + off
            if not floor >> to & 1:
                continue
            if boxes >> to & 1:
                beyond = to + off
                if not (floor >> beyond & 1 and live >> beyond & 1) or boxes >> beyond & 1:
                    continue
                new = (to, boxes ^ (1 << to) ^ (1 << beyond))
            else:
                new = (to, boxes)
            if new in parents:
                continue
            parents[new] = (state, d)
            if new[1] == goal:
                moves = []
                link = parents[new]
                while link is not None:
                    state, d = link
                    moves.append(DIRECTIONS[d])
                    link = parents[state]
                return moves[::-1]
            if len(parents) > max_states:
                raise RuntimeError(f"shortest_moves gave up after {max_states} states; raise max_states or use solve")
            queue.append(new)
    return None
