"""Fuzz the embedded policy server: every malformed request must get a 4xx, never a 5xx, and never
fail a well-formed request running beside it.

    .venv/bin/python benchmarks/fuzz_server.py                  # 1,000 cases on the tiny model, in process
    .venv/bin/python benchmarks/fuzz_server.py --cases 5000 --seed 3
    .venv/bin/python benchmarks/fuzz_server.py --url http://127.0.0.1:8000 --admin-key KEY

Each case takes a valid request to one route (chat, chat with tools beside ``response_format``,
chat with the legacy ``functions``, text completions with text or token ids, the weight and pause
routes, a path the server does not serve) and breaks one thing: a field set to a hostile value (wrong types,
huge or negative numbers, a 5000-digit integer, ``NaN``, lone surrogates, deep nesting, long
strings, Jinja), one message's fields, the raw body (truncated, not an object, invalid UTF-8,
over the size limit) or the headers (no admin key, a wrong one, ``text/plain``). Meanwhile
"neighbours" — well-formed requests — run all the time beside the fuzzed ones, so a bad request
that fails the batch it joined is caught. Prints the cases, how many got 2xx / 4xx / 5xx, the
neighbours that did not get a 200, and every 5xx; exits 1 if there was any.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class Raw:
    """JSON text put into a body as is (what ``json.dumps`` cannot write: NaN, huge integers...)."""

    def __init__(self, text: str) -> None:
        self.text = text


def dumps(value: Any) -> bytes:
    raws: list[str] = []

    def default(obj: Any) -> Any:
        if isinstance(obj, Raw):
            raws.append(obj.text)
            return f"\x00RAW{len(raws) - 1}\x00"
        raise TypeError(type(obj).__name__)

    text = json.dumps(value, default=default)
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(f"\x00RAW{i}\x00"), raw)
    return text.encode("utf-8", "surrogatepass")


def nested(depth: int) -> Raw:
    return Raw("[" * depth + "]" * depth)


HOSTILE: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    7,
    2**31,
    2**63,
    -(2**63) - 1,
    10**30,
    Raw("9" * 5000),
    Raw("-" + "9" * 5000),
    0.5,
    -0.0,
    1e308,
    -1e308,
    1e-320,
    Raw("1e999"),
    Raw("NaN"),
    Raw("Infinity"),
    Raw("-Infinity"),
    "",
    "abc",
    "\u0000",
    "default",
    "tiny",
    Raw('"\\ud800"'),
    Raw('"a\\udfffb"'),
    "x" * 100_000,
    "é" * 5000,
    "<tool_call>",
    "<|im_end|>",
    "{{ 7 * 7 }}",
    "{% for i in range(99999999) %}x{% endfor %}",
    [],
    [None],
    [[]],
    [1, 2, 3],
    [-1],
    [10**30],
    list(range(3000)),
    ["a", 1],
    [""],
    ["stop"] * 100,
    {},
    {"a": 1},
    {"type": "text", "text": 5},
    nested(40),
    nested(100),
    nested(5000),
    [{"type": "text", "text": None}],
    [{"type": "image_url", "image_url": {"url": "x"}}],
    [{"text": ["a"]}],
    {"chat_template": "{{ 7 * 7 }}"},
    {"tokenize": True},
    {"enable_thinking": True},
    {"include_usage": "yes"},
    [{"type": "function", "function": {"name": 5}}],
    "function",
    {"name": "lookup"},
    {"name": 5, "arguments": {"key": 1}},
    [{"name": "lookup", "parameters": {"type": "object"}}],
    [{"description": "no name"}],
    {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}},
    {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "nonsense"}}},
]

FIELDS = [
    "model",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_tokens",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "return_token_ids",
    "stream",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "max_tokens",
    "logprobs",
]
CHAT_FIELDS = [
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_completion_tokens",
    "top_logprobs",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "response_format",
    "functions",
    "function_call",
]
TEXT_FIELDS = ["prompt", "echo"]
MESSAGE_FIELDS = ["role", "content", "name", "tool_call_id", "tool_calls", "function_call"]

CHAT = {
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}],
    "max_tokens": 4,
}
LOOKUP = {
    "name": "lookup",
    "parameters": {"type": "object", "properties": {"key": {"type": "integer"}}, "required": ["key"]},
}
CHAT_TOOLS_JSON = {  # tools beside response_format under auto: the union grammar
    **CHAT,
    "tools": [{"type": "function", "function": LOOKUP}],
    "tool_choice": "auto",
    "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}},
}
CHAT_LEGACY = {  # the legacy functions, with a legacy history
    "messages": [
        {"role": "user", "content": "Look up 7."},
        {"role": "assistant", "content": None, "function_call": {"name": "lookup", "arguments": '{"key": 7}'}},
        {"role": "function", "name": "lookup", "content": "found"},
    ],
    "functions": [LOOKUP],
    "function_call": {"name": "lookup"},
    "max_tokens": 4,
}
UNSERVED = ["/v1/responses", "/v1/messages", "/v1/chat/completion", "/v1/embeddings", "/nope"]
TEXT = {"prompt": "Once upon a time", "max_tokens": 4}
TOKENS = {"prompt": [5, 6, 7, 8], "max_tokens": 4}


@dataclass
class Case:
    route: str
    body: bytes
    headers: dict[str, str]
    what: str


@dataclass
class Tally:
    statuses: Counter = field(default_factory=Counter)
    no_answer: list[str] = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)
    neighbours: Counter = field(default_factory=Counter)
    neighbour_failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        cases = sum(self.statuses.values()) + len(self.no_answer)
        by_class = Counter(f"{s // 100}xx" for s in self.elements())
        ok = self.neighbours[200]
        return (
            f"cases {cases} | 2xx {by_class['2xx']} | 4xx {by_class['4xx']} | 5xx {by_class['5xx']} | "
            f"no answer {len(self.no_answer)} | neighbours ok {ok}/{sum(self.neighbours.values())}"
        )

    def elements(self) -> list[int]:
        return list(self.statuses.elements())

    @property
    def five_xx(self) -> int:
        return sum(n for s, n in self.statuses.items() if s >= 500)


def make_case(rng: random.Random, admin_key: str, max_body_bytes: int) -> Case:
    json_headers = {"Content-Type": "application/json"}
    roll = rng.random()
    if roll < 0.12:  # the control routes
        route = rng.choice(
            ["/update_weights_from_disk", "/pause_generation", "/resume_generation", "/update_weights_from_tensor"]
        )
        body: Any = (
            {"model_path": rng.choice(HOSTILE + ["/nonexistent", "/etc/passwd", "/dev/zero"])}
            if route == "/update_weights_from_disk"
            else {"mode": rng.choice(HOSTILE)}
        )
        how = rng.choice(["no key", "wrong key", "text/plain", "key"])
        headers = dict(json_headers)
        if how == "wrong key":
            headers["Authorization"] = "Bearer nope"
        elif how == "text/plain":
            headers = {"Content-Type": "text/plain", "Authorization": f"Bearer {admin_key}"}
        elif how == "key":
            headers["Authorization"] = f"Bearer {admin_key}"
        if route == "/update_weights_from_tensor":
            return Case(
                route,
                bytes(rng.randrange(256) for _ in range(rng.choice([0, 8, 300]))),
                headers,
                f"{route} garbage ({how})",
            )
        return Case(route, dumps(body), headers, f"{route} {how}: {dumps(body)[:60]!r}")
    if roll > 0.97:  # a path the server does not serve: a 404 naming what it does
        route = rng.choice(UNSERVED)
        return Case(route, dumps(CHAT), json_headers, f"{route} (not served)")
    route, base, fields = rng.choice(
        [
            ("/v1/chat/completions", CHAT, FIELDS + CHAT_FIELDS),
            ("/v1/chat/completions", CHAT_TOOLS_JSON, FIELDS + CHAT_FIELDS),
            ("/v1/chat/completions", CHAT_LEGACY, FIELDS + CHAT_FIELDS),
            ("/v1/completions", TEXT, FIELDS + TEXT_FIELDS),
            ("/v1/completions", TOKENS, FIELDS + TEXT_FIELDS),
        ]
    )
    body = json.loads(json.dumps(base))
    if roll < 0.55:
        name = rng.choice(fields)
        value = rng.choice(HOSTILE)
        body[name] = value
        what = f"{route} {name}={dumps(value)[:50]!r}"
    elif roll < 0.75 and "messages" in body:
        name = rng.choice(MESSAGE_FIELDS)
        value = rng.choice(HOSTILE)
        body["messages"][rng.randrange(len(body["messages"]))][name] = value
        what = f"{route} messages[].{name}={dumps(value)[:50]!r}"
    elif roll < 0.85:  # two fields at once
        for name in rng.sample(fields, 2):
            body[name] = rng.choice(HOSTILE)
        what = f"{route} two fields: {dumps(body)[:80]!r}"
    else:
        raw = dumps(body)
        kind = rng.choice(["truncated", "array", "utf8", "empty", "over limit", "bom", "text/plain", "deep"])
        headers = dict(json_headers)
        if kind == "truncated":
            raw = raw[: rng.randrange(1, len(raw))]
        elif kind == "array":
            raw = b"[" + raw + b"]"
        elif kind == "utf8":
            raw = raw[:-2] + b'"\xff\xfe"}'
        elif kind == "empty":
            raw = b""
        elif kind == "over limit":
            raw = dumps({**body, "user": "x" * (max_body_bytes + 10)})
        elif kind == "bom":
            raw = b"\xef\xbb\xbf" + raw
        elif kind == "text/plain":
            headers = {"Content-Type": "text/plain"}
        else:
            raw = dumps({**body, "user": nested(rng.choice([65, 900, 100_000]))})
        return Case(route, raw, headers, f"{route} raw body: {kind}")
    return Case(route, dumps(body), json_headers, what)


async def neighbours(http: httpx.AsyncClient, url: str, tally: Tally, stop: asyncio.Event, workers: int = 3) -> None:
    """Well-formed requests, all the time, beside the fuzzed ones: each must answer 200."""
    bodies = [("/v1/completions", TOKENS), ("/v1/chat/completions", CHAT), ("/v1/completions", TEXT)]

    async def one(k: int) -> None:
        i = k
        while not stop.is_set():
            route, body = bodies[i % len(bodies)]
            i += 1
            try:
                r = await http.post(url + route, json={**body, "max_tokens": 8, "ignore_eos": True})
                tally.neighbours[r.status_code] += 1
                if r.status_code != 200:
                    tally.neighbour_failures.append(f"{route}: {r.status_code} {r.text[:200]}")
            except httpx.HTTPError as exc:
                tally.neighbours["no answer"] += 1
                tally.neighbour_failures.append(f"{route}: {type(exc).__name__} {exc}")

    await asyncio.gather(*(one(k) for k in range(workers)))


async def fuzz(
    url: str,
    admin_key: str,
    cases: int = 1000,
    seed: int = 0,
    concurrency: int = 8,
    max_body_bytes: int = 16 << 20,
    progress: bool = False,
) -> Tally:
    """Send ``cases`` fuzzed requests to the server at ``url``; returns what came back."""
    rng = random.Random(seed)
    tally = Tally()
    stop = asyncio.Event()
    todo = [make_case(rng, admin_key, max_body_bytes) for _ in range(cases)]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cases, desc="fuzz", unit="case")
    async with httpx.AsyncClient(timeout=120.0) as http:
        background = asyncio.create_task(neighbours(http, url, tally, stop))
        queue = iter(todo)

        async def worker() -> None:
            for case in queue:
                try:
                    r = await http.post(url + case.route, content=case.body, headers=case.headers)
                    tally.statuses[r.status_code] += 1
                    if r.status_code >= 500:
                        tally.server_errors.append(f"{case.what} -> {r.status_code} {r.text[:300]}")
                    if case.route == "/pause_generation" and r.status_code == 200:
                        await http.post(
                            url + "/resume_generation", json={}, headers={"Authorization": f"Bearer {admin_key}"}
                        )
                except httpx.HTTPError as exc:
                    tally.no_answer.append(f"{case.what} -> {type(exc).__name__}: {exc}")
                if bar is not None:
                    bar.update(1)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        stop.set()
        await background
        health = await http.get(url + "/health")
        if health.status_code != 200:
            tally.server_errors.append(f"/health answered {health.status_code} after the run")
    if bar is not None:
        bar.close()
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--url", default=None, help="a running server (default: the tiny model, in process)")
    parser.add_argument("--admin-key", default=None, help="that server's admin key")
    args = parser.parse_args(argv)
    handle = None
    url, key = args.url, args.admin_key or "unknown"
    if url is None:
        from agentgym.server.launch import start_embedded_server

        handle = start_embedded_server("tiny", port=0)
        url, key = handle.url, getattr(handle, "admin_key", None) or "none"
    try:
        started = time.perf_counter()
        tally = asyncio.run(fuzz(url.rstrip("/"), key, args.cases, args.seed, args.concurrency, progress=True))
    finally:
        if handle is not None:
            handle.stop()
    print(tally.summary() + f" | {time.perf_counter() - started:.0f} s")
    print("statuses: " + ", ".join(f"{s}: {n}" for s, n in sorted(tally.statuses.items())))
    for line in tally.server_errors + tally.neighbour_failures + tally.no_answer[:20]:
        print("  " + line)
    return 1 if tally.five_xx or tally.server_errors or tally.neighbour_failures else 0


if __name__ == "__main__":
    sys.exit(main())
