"""``CalculatorTool``: arithmetic on numbers, evaluated by walking Python's AST (never ``eval``).

Allowed: numbers, ``+ - * / // % **`` (``^`` means power), parentheses, unary minus, and
``abs round min max sqrt floor ceil``. Thousands separators (``1,000``) are accepted. Every number
is bounded before it is built (no ``9**9**9**9``, no ``round(1, -10**300)``): literals, results,
powers and ``round``'s digits that would take long to compute fail with an error, or are clamped
where that gives the same answer. Any expression returns or raises ``ToolError`` within
milliseconds: the calculator runs in the caller's process, holding its interpreter lock, where
no timeout can stop it.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from typing import Any, ClassVar

from agentgym.envs.tools.base import Tool, ToolError

MAX_EXPRESSION_CHARS = 1000
MAX_ABS = 10**300  # results beyond this are refused (floats overflow near 1.8e308 anyway)
MAX_LOG10 = 300  # the same bound on a power's result, checked before it is computed
ROUND_DIGITS = 400  # round(x, n) of any allowed x is the same for every n beyond +-this

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.BitXor: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _round(number: Any, ndigits: Any = None) -> Any:
    if isinstance(ndigits, int):  # round(1, -10**300) would build 10**(10**300)
        ndigits = max(-ROUND_DIGITS, min(ROUND_DIGITS, ndigits))
    return round(number) if ndigits is None else round(number, ndigits)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "round": _round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "floor": math.floor,
    "ceil": math.ceil,
}
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _check_size(value: Any) -> Any:
    if isinstance(value, complex):
        raise ToolError("the result is a complex number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("the result is not a finite number")
    if abs(value) > MAX_ABS:
        raise ToolError("the result is too large")
    return value


def _power(base: Any, exponent: Any) -> Any:
    # |base ** exponent| = 10 ** (exponent * log10|base|): refuse it before building it
    if abs(base) not in (0, 1) and exponent * math.log10(abs(base)) > MAX_LOG10:
        raise ToolError("the power is too large")
    try:
        return base**exponent
    except ZeroDivisionError:
        raise ToolError("zero cannot be raised to a negative power") from None


def _evaluate(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return _check_size(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, (ast.Pow, ast.BitXor)):
            return _check_size(_power(left, right))
        try:
            return _check_size(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        args = [_evaluate(a) for a in node.args]
        try:
            return _check_size(_FUNCTIONS[node.func.id](*args))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ToolError(f"{node.func.id}: {exc}") from None
    raise ToolError(
        f"unsupported syntax {ast.unparse(node)!r}; use numbers, + - * / // % ** ( ) and {', '.join(_FUNCTIONS)}"
    )


def format_number(value: int | float) -> str:
    """``6.0`` -> ``"6"``; floats to 12 significant digits; ints as they are."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.12g}"
    return str(value)


def calculate(expression: str) -> str:
    """Evaluate an arithmetic ``expression`` and format the result; ToolError if it is not one."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    cleaned = _THOUSANDS_RE.sub("", expression.strip().replace("×", "*").replace("÷", "/"))
    try:
        tree = ast.parse(cleaned, mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"cannot parse {expression!r}: {exc.msg}") from None
    except ValueError as exc:  # e.g. a NUL character
        raise ToolError(f"cannot parse {expression!r}: {exc}") from None
    except (RecursionError, MemoryError):
        raise ToolError("the expression is nested too deeply") from None
    try:
        return format_number(_evaluate(tree))
    except OverflowError:
        raise ToolError("the result is too large") from None
    except RecursionError:
        raise ToolError("the expression is nested too deeply") from None


class CalculatorTool(Tool):
    """Evaluate an arithmetic expression."""

    name: ClassVar[str] = "calculator"
    description: ClassVar[str] = (
        "Evaluate an arithmetic expression and return the number. Supports + - * / // % ** (or ^), "
        "parentheses and abs, round, min, max, sqrt, floor, ceil. Example: (16 - 3 - 4) * 2"
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "expression": {"type": "string", "description": "the arithmetic expression, e.g. '3 * (4 + 5)'"}
        },
        "required": ["expression"],
    }

    def execute(self, arguments: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            raise ToolError('calculator needs {"expression": "<arithmetic>"}')
        return calculate(expression), 0.0, {}
