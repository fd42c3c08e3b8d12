"""``agentgym view``: the static trajectory page, in a real headless browser where one is installed."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from agentgym.cli import main
from agentgym.model import load_tokenizer
from agentgym.rollout.storage import write_trajectories
from agentgym.rollout.viewer import load_records, render
from agentgym.types import Trajectory, Turn


def episodes(tok) -> list[Trajectory]:
    """Six episodes over two envs with known rewards and lengths."""
    out = []
    for i in range(6):
        prompt = tok.encode(f"<|im_start|>user\nplay level {i}<|im_end|>\n<|im_start|>assistant\n")
        reply = tok.encode(f"<answer>Up</answer> {'x' * i}<|im_end|>")
        turn = Turn(
            prompt_ids=prompt,
            response_ids=reply,
            logprobs=[-0.1 * (k % 7) for k in range(len(reply))],
            reward=float(i) - 2.0,
            weight_version=i % 3,
        )
        out.append(
            Trajectory(
                turns=[turn],
                outcome_reward=1.0 if i % 2 else 0.0,
                env_id="sokoban" if i < 4 else "gsm8k",
                seed=100 + i,
                status="ok" if i != 5 else "failed",
                failure="env.step raised: boom" if i == 5 else None,
                metrics={"success": float(i % 2)},
            )
        )
    return out


@pytest.fixture
def trajectory_file(tmp_path):
    path = tmp_path / "traj.jsonl"
    write_trajectories(path, episodes(load_tokenizer("tiny")))
    return path


def test_page_holds_every_episode_with_token_pieces(trajectory_file):
    tok = load_tokenizer("tiny")
    page = render(load_records(trajectory_file), tok)
    data = json.loads(page.split('<script id="data" type="application/json">')[1].split("</script>")[0])
    assert len(data) == 6 and {d["env"] for d in data} == {"sokoban", "gsm8k"}
    first = data[0]["turns"][0]
    assert "".join(piece for piece, _ in first["gen"]) == tok.decode(episodes(tok)[0].turns[0].response_ids)
    assert [lp for _, lp in first["gen"]][:3] == [0.0, -0.1, -0.2]
    assert data[3]["reward"] == pytest.approx(1.0 + 1.0)  # turn reward 1, outcome 1
    assert "<script" not in page.split('id="data"')[1].split("</script>")[0]  # data cannot close its element


def test_samples_file_and_unknown_tokenizer_still_render(tmp_path):
    """A run's samples.jsonl (extra keys) renders; ids a tokenizer cannot hold fall back to text."""
    traj = episodes(load_tokenizer("tiny"))[0]
    traj.turns[0].response_ids = [10**7]
    traj.turns[0].logprobs = [-1.0]
    traj.turns[0].response_text = "<answer>Up</answer>"
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps({"step": 3, "split": "val", **traj.to_dict()}) + "\nnot json\n")
    data = json.loads(
        render(load_records(path), load_tokenizer("tiny")).split('type="application/json">')[1].split("</script>")[0]
    )
    assert data[0]["step"] == 3 and data[0]["split"] == "val"
    assert data[0]["turns"][0]["text"] == "<answer>Up</answer>" and "gen" not in data[0]["turns"][0]


def test_view_command_and_bad_input(tmp_path, trajectory_file, capsys):
    out = tmp_path / "v.html"
    assert main(["view", str(trajectory_file), "-o", str(out)]) == 0
    assert out.read_text().startswith("<!doctype html>")
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"no": "turns"}\n')
    assert main(["view", str(empty)]) == 2
    assert "holds no trajectories" in capsys.readouterr().err


def chromium() -> str | None:
    return os.environ.get("AGENTGYM_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.browser
def test_the_page_in_a_headless_browser(tmp_path, trajectory_file):
    playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the browser extra)")
    browser_path = chromium()
    if browser_path is None:
        pytest.skip("no chromium: apt-get install chromium (or set AGENTGYM_CHROMIUM)")
    page_file = tmp_path / "view.html"
    assert main(["view", str(trajectory_file), "-o", str(page_file)]) == 0
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=browser_path,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.goto(page_file.as_uri())
            assert page.locator(".card").count() == 6
            assert page.inner_text("#count") == "showing 6 of 6 episodes"
            page.fill("#f-rmin", "1.5")  # rewards are -2, -0, 0, 2, 2, 4 (turn + outcome)
            assert page.inner_text("#count") == "showing 3 of 6 episodes"
            assert page.locator(".card:visible").count() == 3
            page.select_option("#f-env", "gsm8k")
            assert page.inner_text("#count") == "showing 2 of 6 episodes"
            page.fill("#f-rmin", "")
            page.select_option("#f-status", "failed")
            assert page.inner_text("#count") == "showing 1 of 6 episodes"
            page.locator(".card:visible .head").first.click()
            assert "boom" in page.inner_text(".card:visible")
            assert page.locator(".card:visible .tok").count() > 0
            shot = tmp_path / "view.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            assert errors == []
        finally:
            browser.close()
