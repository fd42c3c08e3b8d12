"""README.md is the first page: its commands and Python examples must keep working, and its links and
the docs' must lead somewhere."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def run_python(code: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_readme_is_a_first_page_with_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    commands = "\n".join(fenced(text, "bash"))
    assert "bash scripts/setup.sh && .venv/bin/agentgym train --env sokoban" in commands
    assert "bash scripts/test.sh" in commands  # .ci/run and newcomers run what the README says


def test_no_machine_paths_or_load_averages_outside_results():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    found = [
        f"{page.relative_to(ROOT)}: {match.group(0)!r}"
        for page in pages
        if page.name != "results.md"
        for match in re.finditer(r"/work/\S*|/home/\S*|load average", page.read_text())
    ]
    assert found == [], "measurement context belongs in docs/results.md"


def test_links_between_the_readme_and_docs_resolve():
    def anchors(page: Path) -> set[str]:
        headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M), re.M)
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}

    broken = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)} -> {target} (no such heading)")
    assert broken == []


def test_import_agentgym_stays_light():
    code = "import sys, agentgym; agentgym.train; print(sorted({'torch', 'ray', 'omegaconf'} & set(sys.modules)))"
    done = run_python(code, ROOT, 60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_train_reports_a_bad_key_before_any_work(tmp_path, monkeypatch):
    import agentgym
    from agentgym.config import ConfigError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="total_training_step"):
        agentgym.train(env="sokoban", overrides=["trainer.total_training_stepz=2"])
    assert not (tmp_path / "outputs").exists()


def test_readme_env_example_registers_a_playable_env(tmp_path):
    (example,) = [block for block in fenced(README.read_text(), "python") if "class Guess" in block]
    code = example + (
        "\nenv = agentgym.make('guess')\nmessages, info = env.reset(seed=0)\n"
        "_, reward, terminated, _, info = env.step(str(env.unwrapped.target))\n"
        "assert terminated and reward == 1.0 and info['success'], (reward, info)\nprint('solved')\n"
    )
    done = run_python(code, tmp_path, 120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("solved")


@pytest.mark.slow
def test_readme_python_example_trains_and_returns_the_held_out_table(tmp_path):
    """The README's `agentgym.train` example as written: the main job's stages, shrunk to about a minute."""
    (example,) = [block for block in fenced(README.read_text(), "python") if "agentgym.train(" in block]
    done = run_python(example + "\nprint('RUN_DIR', result['run_dir'])\n", tmp_path, 600)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / done.stdout.split("RUN_DIR ")[-1].strip()
    assert (run_dir / "held_out.json").is_file() and (run_dir / "huggingface").is_dir()
    assert "after RL" in done.stdout
