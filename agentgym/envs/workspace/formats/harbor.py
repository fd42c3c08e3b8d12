"""Harbor / Terminal-Bench task directories as ``WorkspaceTask``s, read from local files (nothing downloads).

A Harbor task directory (the layout of ``harbor``'s ``TaskPaths``, schema 1.x ``task.toml``)::

    instruction.md        what the agent is told
    task.toml             [metadata], [verifier] timeout_sec, [agent] timeout_sec, [environment] (docker_image,
                          cpus, memory_mb, gpus, allow_internet, workdir, ...)
    environment/          the image's build context: a Dockerfile (or docker-compose.yaml) and the files it copies
    tests/test.sh         run from the working directory after the agent; writes /logs/verifier/reward.txt
                          (a number) or /logs/verifier/reward.json ({name: number}); Harbor copies tests/ to /tests
    solution/solve.sh     the oracle solution (Harbor copies solution/ to /solution)

agentgym runs such a task without a container: the files the Dockerfile copies into its working directory become
``task.files``; the working directory (``WORKDIR``, usually ``/app``) becomes the sandbox's ``/workspace`` (every
``/app`` path in the instruction, the tests and the solution is rewritten to it); ``tests/`` becomes verifier files
under ``.harbor/tests`` with ``/tests`` and ``/logs/verifier`` rewritten beside it, and one ``command`` check runs
``test.sh`` and passes when the reward is at least 1 (every value of ``reward.json``). ``solve.sh`` becomes the
expert: one ``bash`` call, then ``submit``.

What cannot be built that way is refused with the reason (``UnsupportedTask``): a Dockerfile that runs anything
(``RUN``: installing packages needs the network and an image), sets ``ENV``/``USER``, copies from another stage or a
URL or outside the working directory; a prebuilt ``docker_image``, docker-compose, GPUs, MCP servers, multi-step
tasks, ``allow_internet = true``; tests or a solution that install or download (``apt-get``, ``pip install``,
``curl``, ``uv``, ...). A container backend that would run those is not implemented. The base image (``FROM``) is
not used: commands run on the sandbox's host tools (bash, coreutils, python3, git).
"""

from __future__ import annotations

import posixpath
import re
import warnings
from pathlib import Path
from typing import Any

from agentgym.envs.workspace.expert_calls import bash, submit, write_file
from agentgym.envs.workspace.formats import UnsupportedTask
from agentgym.envs.workspace.task import Check, WorkspaceTask

try:
    import tomllib
except ImportError:  # Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ImportError:
        tomllib = None  # type: ignore[assignment]

WORKSPACE = "/workspace"
HARBOR_DIR = ".harbor"
NETWORK_WORDS = re.compile(
    r"\b(apt-get|apt|apk|yum|dnf|pip3?\s+install|uv\s+(pip|add|sync|run|tool)|uvx|curl|wget|npm\s+(i|install)|git\s+clone)\b"
)
"""Commands that install or download: a task whose tests or solution run them needs the network."""
IGNORED_INSTRUCTIONS = ("FROM", "LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "ARG", "MAINTAINER", "STOPSIGNAL")

VERIFY_SCRIPT = '''"""Run a Harbor task's tests/test.sh in the workspace and pass when its reward is at least 1."""
import json, os, pathlib, shutil, subprocess, sys

root = pathlib.Path.cwd()
harbor = root / "{harbor}"
logs = harbor / "logs" / "verifier"
shutil.rmtree(harbor / "logs", ignore_errors=True)
logs.mkdir(parents=True)
proc = subprocess.run(["bash", str(harbor / "tests" / "test.sh")], cwd=root)
text = logs / "reward.txt"
if text.exists():
    rewards = {{"reward": float(text.read_text().strip() or "nan")}}
elif (logs / "reward.json").exists():
    rewards = {{k: float(v) for k, v in json.loads((logs / "reward.json").read_text()).items()}}
else:
    sys.exit(f"test.sh (exit {{proc.returncode}}) wrote no reward.txt or reward.json")
print("rewards:", rewards)
sys.exit(0 if rewards and all(v >= 1.0 for v in rewards.values()) else 1)
'''


def load_harbor_task(task_dir: str | Path, workspace: str = WORKSPACE, max_turns: int = 30) -> WorkspaceTask:
    """One Harbor task directory -> a ``WorkspaceTask``. ``workspace``: the absolute path the task's working
    directory maps to (the sandbox's ``/workspace``). Raises ``UnsupportedTask`` (with the reason) for a task
    that needs a container, and ``FileNotFoundError`` for a directory that is not a Harbor task."""
    root = Path(task_dir)
    for required in ("instruction.md", "task.toml"):
        if not (root / required).is_file():
            raise FileNotFoundError(f"{root} is not a Harbor task directory: no {required}")
    if tomllib is None:
        raise ImportError("reading task.toml needs Python 3.11+ (tomllib) or the tomli package: pip install tomli")
    try:
        config = tomllib.loads((root / "task.toml").read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UnsupportedTask(f"{root / 'task.toml'}: not valid TOML ({exc})") from None
    name = (config.get("task") or {}).get("name") or root.name
    env_config = config.get("environment") or {}
    _refuse_config(root, config, env_config)
    workdir, files = _environment(root / "environment", env_config.get("workdir"))
    rewrite = _rewriter(workdir, workspace)
    verifier_files = {
        f"{HARBOR_DIR}/tests/{path}": rewrite(text) for path, text in _text_tree(root / "tests", "tests").items()
    }
    if f"{HARBOR_DIR}/tests/test.sh" not in verifier_files:
        raise UnsupportedTask(f"{root}: no tests/test.sh (a tests/test.bat is Windows-only)")
    _refuse_network(root / "tests", verifier_files[f"{HARBOR_DIR}/tests/test.sh"])
    verifier_files[f"{HARBOR_DIR}/verify.py"] = VERIFY_SCRIPT.format(harbor=HARBOR_DIR)
    timeout = float((config.get("verifier") or {}).get("timeout_sec", 600.0))
    return WorkspaceTask(
        task_id=f"harbor/{name}",
        instruction=rewrite((root / "instruction.md").read_text()).strip(),
        files=files,
        checks=(Check(kind="command", command=f"python3 {HARBOR_DIR}/verify.py", timeout_s=timeout),),
        verifier_files=verifier_files,
        expert=_expert(root / "solution", rewrite),
        max_turns=max_turns,
        metadata={"suite": "harbor", "path": str(root), "workdir": workdir, **(config.get("metadata") or {})},
    )


def _refuse_config(root: Path, config: dict[str, Any], env: dict[str, Any]) -> None:
    reasons = []
    if config.get("steps"):
        reasons.append("it is a multi-step task (steps = [...])")
    if env.get("docker_image"):
        reasons.append(f"it runs in the prebuilt image {env['docker_image']!r}")
    if str(env.get("os", "linux")).lower() not in ("linux", ""):
        reasons.append(f"it targets os = {env['os']!r}")
    if env.get("gpus") or env.get("gpu_types") or env.get("tpu"):
        reasons.append("it needs an accelerator")
    if env.get("mcp_servers"):
        reasons.append("it needs MCP servers")
    if env.get("allow_internet"):
        reasons.append("it needs the network (allow_internet = true)")
    if (env.get("env") or {}) or ((config.get("verifier") or {}).get("env") or {}):
        reasons.append("it sets environment variables ([environment.env] / [verifier.env])")
    if reasons:
        raise UnsupportedTask(f"{root}: {'; '.join(reasons)}; agentgym has no container backend for it")


def _environment(env_dir: Path, workdir: str | None) -> tuple[str, dict[str, str]]:
    """(the working directory, the files the Dockerfile copies into it, relative to it)."""
    for compose in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml"):
        if (env_dir / compose).exists():
            raise UnsupportedTask(f"{env_dir / compose}: a multi-container task needs a container backend")
    dockerfile = env_dir / "Dockerfile"
    if not dockerfile.is_file():
        raise UnsupportedTask(f"{env_dir}: no Dockerfile")
    cwd = "/"
    copies: list[tuple[list[str], str, str]] = []  # (sources, destination, the WORKDIR then)
    for line in _instructions(dockerfile.read_text()):
        word, _, rest = line.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word in IGNORED_INSTRUCTIONS:
            continue
        if word == "WORKDIR":
            cwd = rest if rest.startswith("/") else f"{cwd.rstrip('/')}/{rest}"
        elif word in ("COPY", "ADD"):
            args = rest.split()
            flags = [a for a in args if a.startswith("--")]
            if any(f.startswith("--from") for f in flags):
                raise UnsupportedTask(f"{dockerfile}: {line!r} copies from another image")
            paths = [a for a in args if not a.startswith("--")]
            if len(paths) < 2 or any("://" in p for p in paths):
                raise UnsupportedTask(f"{dockerfile}: {line!r}: only local COPY/ADD src... dst is supported")
            copies.append((paths[:-1], paths[-1], cwd))
        elif word == "RUN":
            raise UnsupportedTask(
                f"{dockerfile}: {line!r}: building the image runs commands (installing packages needs the "
                "network and a container); agentgym runs Harbor tasks without a container: only FROM, WORKDIR and "
                "COPY/ADD of local files are supported"
            )
        else:
            raise UnsupportedTask(f"{dockerfile}: {line!r}: {word} is not supported without a container")
    workdir = posixpath.normpath(workdir or cwd)
    if workdir == "/":
        raise UnsupportedTask(f"{dockerfile}: no WORKDIR: the task's working directory is unknown")
    files: dict[str, str] = {}
    for sources, dest, at in copies:
        target = posixpath.normpath(dest if dest.startswith("/") else f"{at.rstrip('/')}/{dest}")
        if target != workdir and not target.startswith(workdir + "/"):
            raise UnsupportedTask(f"{dockerfile}: COPY to {target} is outside the working directory {workdir}")
        rel = target[len(workdir) :].strip("/")
        matched = [p for s in sources for p in sorted(env_dir.glob(s))]
        if not matched:
            raise UnsupportedTask(f"{dockerfile}: COPY {' '.join(sources)}: no such file in {env_dir}")
        into_dir = dest.endswith("/") or len(matched) > 1 or matched[0].is_dir() or rel == ""
        for src in matched:
            if src.is_dir():
                for path, text in _text_tree(src, str(src)).items():
                    files[f"{rel}/{path}".lstrip("/")] = text
            else:
                files[f"{rel}/{src.name}".lstrip("/") if into_dir else rel] = _read_text(src)
    return workdir, files


def _instructions(text: str) -> list[str]:
    """Dockerfile lines: comments dropped, ``\\`` continuations joined."""
    out, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        out.append((current + line).strip())
        current = ""
    if current.strip():
        out.append(current.strip())
    return out


def _rewriter(workdir: str, workspace: str):
    pattern = re.compile(rf"(?<![\w/.-]){re.escape(workdir)}(?=/|\b|$)")
    tests = re.compile(r"(?<![\w/.-])/tests(?=/|\b|$)")
    logs = re.compile(r"(?<![\w/.-])/logs/verifier(?=/|\b|$)")
    solution = re.compile(r"(?<![\w/.-])/solution(?=/|\b|$)")

    def rewrite(text: str) -> str:
        text = logs.sub(f"{workspace}/{HARBOR_DIR}/logs/verifier", text)
        text = tests.sub(f"{workspace}/{HARBOR_DIR}/tests", text)
        text = solution.sub(f"{workspace}/{HARBOR_DIR}/solution", text)
        return pattern.sub(workspace, text)

    return rewrite


def _text_tree(directory: Path, label: str) -> dict[str, str]:
    if not directory.is_dir():
        return {}
    return {
        path.relative_to(directory).as_posix(): _read_text(path)
        for path in sorted(directory.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UnsupportedTask(f"{path} is not UTF-8 text: workspace files are text") from None


def _refuse_network(where: Path, script: str) -> None:
    match = NETWORK_WORDS.search(script)
    if match:
        raise UnsupportedTask(
            f"{where}: the script runs {match.group(0)!r} (installing or downloading needs the network; the "
            "sandbox has none and agentgym has no container backend)"
        )


def _expert(solution_dir: Path, rewrite) -> tuple[dict[str, Any], ...]:
    """``solve.sh`` as one bash call (other solution files written first, under ``.harbor/solution``), then
    submit; empty when there is no ``solve.sh``."""
    files = {path: rewrite(text) for path, text in _text_tree(solution_dir, "solution").items()}
    script = files.pop("solve.sh", None)
    if script is None:
        return ()
    _refuse_network(solution_dir, script)
    writes = [write_file(f"{HARBOR_DIR}/solution/{path}", text) for path, text in files.items()]
    return (*writes, bash(script), submit())


class HarborTasks:
    """A task source over Harbor task directories: ``path`` is one task directory or a folder of them (sorted by
    name); seed ``s`` is task ``s % len``. Every task is read when the source is made: a refused task raises
    (``UnsupportedTask`` naming each one and why) unless ``skip_unsupported``, which warns and leaves it out."""

    def __init__(self, path: str | Path, skip_unsupported: bool = False, max_turns: int = 30) -> None:
        root = Path(path)
        if (root / "task.toml").is_file():
            dirs = [root]
        elif root.is_dir():
            dirs = sorted(p for p in root.iterdir() if (p / "task.toml").is_file())
        else:
            raise FileNotFoundError(f"no Harbor task directory at {root}")
        if not dirs:
            raise FileNotFoundError(f"{root} holds no Harbor task directory (a folder with task.toml)")
        self.tasks: list[WorkspaceTask] = []
        self.refused: dict[str, str] = {}
        for d in dirs:
            try:
                self.tasks.append(load_harbor_task(d, max_turns=max_turns))
            except UnsupportedTask as exc:
                self.refused[d.name] = str(exc)
        if self.refused and (not skip_unsupported or not self.tasks):
            raise UnsupportedTask(
                f"{len(self.refused)} of {len(dirs)} Harbor task(s) cannot run here:\n"
                + "\n".join(f"  {name}: {why}" for name, why in self.refused.items())
                + ("\n(skip_unsupported=true leaves them out)" if self.tasks or len(dirs) > 1 else "")
            )
        if self.refused:
            warnings.warn(
                f"left out {len(self.refused)} Harbor task(s) that cannot run here: {', '.join(self.refused)}",
                stacklevel=2,
            )

    def __len__(self) -> int:
        return len(self.tasks)

    def __call__(self, seed: int) -> WorkspaceTask:
        return self.tasks[int(seed) % len(self.tasks)]
