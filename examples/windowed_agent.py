"""A context-limited agent: it keeps only its last exchanges, and trains through the gateway as one episode.

    agentgym train --agent examples.windowed_agent:run data.train_files=guesses.jsonl

The agent plays "guess my number" with the model: each turn the model names a number, the agent answers
"higher" or "lower", and the next request carries the system prompt, the task and only the last
``WINDOW`` exchanges, as an agent with a short context (or a summary of its own) does. No request then
extends the one before it, so the gateway records a new branch for each; ``AgentTrajectorySource`` joins
the session's chain of branches into one episode (docs/long_horizon.md, "Agents that rewrite their
context"), whose turns train as per-turn samples, each on exactly the tokens the server was sent and
sampled. The agent returns its reward (1.0 when it found the number), so the gateway takes it as the
outcome. A task row is a GSM8K-style row whose answer is the number:
``{"question": "Guess.", "answer": "#### 37"}``.

Try it against any OpenAI-compatible server too:

    python examples/windowed_agent.py --base-url http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import re

from openai import OpenAI

TURNS = 6
WINDOW = 2  # exchanges kept after the task
SYSTEM = "Guess the number between 1 and 100. Reply with one number."


def feedback(reply: str, target: int) -> tuple[str, bool]:
    """What the game says to a reply, and whether it found the number."""
    found = re.search(r"-?\d{1,9}", reply or "")  # bounded: int() refuses strings of thousands of digits
    if not found:
        return "Reply with one number.", False
    guess = int(found.group())
    if guess == target:
        return "Correct.", True
    return ("Higher." if guess < target else "Lower."), False


def run(base_url: str, api_key: str, task: dict, model: str = "policy") -> float:
    """Play one game; returns 1.0 when the model named the number within ``TURNS`` turns, else 0.0."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=5, timeout=600)
    target = int(str(task.get("answer", "#### 50")).rsplit("####", 1)[-1])
    head = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.get("question") or "Guess."}]
    exchanges: list[list[dict]] = []
    for _ in range(TURNS):
        messages = head + [m for pair in exchanges[-WINDOW:] for m in pair]
        reply = client.chat.completions.create(model=model, messages=messages).choices[0].message.content or ""
        said, won = feedback(reply, target)
        if won:
            return 1.0
        exchanges.append([{"role": "assistant", "content": reply}, {"role": "user", "content": said}])
    return 0.0


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Play one game of guess-my-number with a model.")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", default="default")
    parser.add_argument("--number", type=int, default=37)
    args = parser.parse_args()
    print(run(args.base_url, args.api_key, {"answer": f"#### {args.number}"}, model=args.model))
