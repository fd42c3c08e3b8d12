"""reasoning-gym datasets as single-turn envs: ``rg/<task>`` for every registered dataset.

    agentgym.make("rg/chain_sum", size=200, seed=1, min_terms=2, max_terms=3)

Every keyword other than the env's own (``system_prompt``, ``tag``) is a dataset argument:
``reasoning_gym.create_dataset(task, **kwargs)`` (``size`` and ``seed`` included), so a task's
difficulty is set the way reasoning-gym's configs set it. ``seed`` defaults to 0 (reasoning-gym
draws a random one otherwise, and env copies in other workers would hold other rows). The dataset's rows are the env's
tasks (``num_tasks() == size``; ``options={"index": i}`` picks one, else ``seed % size``).

The prompt is reasoning-gym's own: one of its ``SYSTEM_PROMPTS`` (``"default"``) and the row's
question. The reply's answer is read with reasoning-gym's ``extract_answer`` (the last
``<answer>...</answer>``; ``tag`` names another tag) and scored by the dataset's
``score_answer(answer, entry)``: the outcome reward is exactly the package's score.
"""

from __future__ import annotations

from typing import Any

from agentgym.envs.base import TextEnv, reply_text
from agentgym.registry import EnvFamily, EnvSpec
from agentgym.types import Action, Message


class ReasoningGymEnv(TextEnv):
    """A reasoning-gym dataset: one question, one answer, the dataset's own score as the reward."""

    max_turns = 1

    def __init__(
        self,
        task: str,
        system_prompt: str | None = "default",
        tag: str = "answer",
        render_mode: str | None = None,
        **dataset_kwargs: Any,
    ) -> None:
        super().__init__(render_mode=render_mode)
        import reasoning_gym
        from reasoning_gym.utils import SYSTEM_PROMPTS

        self.task_name = task
        self.tag = tag
        self.dataset = reasoning_gym.create_dataset(task, **{"seed": 0, **dataset_kwargs})
        self.system_prompt = SYSTEM_PROMPTS.get(system_prompt, system_prompt) if system_prompt else None
        self.entry: dict[str, Any] | None = None
        self.index = 0
        self._reply = ""

    def num_tasks(self) -> int:
        return len(self.dataset)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """The row ``options["index"]`` (else ``seed % size``, else a random one) as a prompt."""
        super().reset(seed=seed)
        size = len(self.dataset)
        if options and options.get("index") is not None:
            self.index = int(options["index"]) % size
        elif seed is not None:
            self.index = seed % size
        else:
            self.index = int(self.np_random.integers(size))
        self.entry = self.dataset[self.index]
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": self.entry["question"]})
        return messages, {"index": self.index, "data_source": f"rg/{self.task_name}"}

    def score(self, text: str) -> tuple[float, str | None]:
        """(the dataset's score, the extracted answer) for a reply's text."""
        from reasoning_gym.utils import extract_answer

        assert self.entry is not None, "call reset() first"
        answer = extract_answer(text, tag_name=self.tag)
        return float(self.dataset.score_answer(answer, self.entry)), answer

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Score the reply: no new messages, turn reward 0, ``info["outcome_reward"]`` the score."""
        if self.entry is None:
            raise RuntimeError("call reset() before step()")
        self._reply = reply_text(action)
        score, answer = self.score(self._reply)
        info = {
            "index": self.index,
            "data_source": f"rg/{self.task_name}",
            "outcome_reward": score,
            "success": score >= 1.0,
            "answer": answer,
            "ground_truth": self.entry.get("answer"),
            "metrics": {"score": score, "answer_found": float(answer is not None)},
        }
        return [], 0.0, True, False, info

    def render(self) -> str | None:
        if self.entry is None:
            return None
        return f"[user] {self.entry['question']}\n[assistant] {self._reply}\n(answer: {self.entry.get('answer')})"


class ReasoningGymFamily(EnvFamily):
    prefix = "rg"
    member_label = "task"
    description = "reasoning-gym datasets, one answer scored by the dataset's score_answer"
    requires = "reasoning-gym"
    extra = "reasoning-gym"

    def members(self) -> list[str]:
        from reasoning_gym.factory import DATASETS

        return sorted(DATASETS)

    def member_spec(self, member: str) -> EnvSpec:
        from reasoning_gym.factory import DATASETS

        doc = (DATASETS[member][0].__doc__ or "").strip().splitlines()
        return EnvSpec(
            name=f"rg/{member}",
            entry_point=ReasoningGymEnv,
            kwargs={"task": member},
            description=f"reasoning-gym: {doc[0] if doc else member}",
        )


FAMILY = ReasoningGymFamily()
