"""On-policy distillation on Sokoban: does a weak student close its gap to a strong teacher within a
time budget, and faster than more SFT on the demos?

    python benchmarks/distill.py --teacher RUN/huggingface --demos RUN/warm_start/demos/demos.jsonl

``RUN`` is a finished ``agentgym train --env sokoban`` (the README's main job): its final model is the
teacher, its demos the SFT data. The phases, each kept in ``--out`` and skipped when already there:

1. **student**: ``agentgym sft`` from the tiny model, ``--start-steps`` (100) steps on the demos with the
   main job's SFT settings (its schedule over those steps);
2. **distill** arm: ``agentgym train --env sokoban`` from the student with ``distillation.enable=true``,
   the teacher as ``distillation.teacher.path`` and ``--env-coef`` (0: pure distillation), saving a
   checkpoint every ``--save-every`` steps; stopped when ``--budget-min`` minutes are up;
3. **sft** arm: ``agentgym sft`` from the student on the same demos, continuing as the main job's SFT
   does: its remaining ``--sft-total - --start-steps`` steps (500 of 600), cosine from the preset's
   peak rate down to a tenth, a checkpoint every ``--sft-save-every`` steps; stopped at the budget too;
4. every checkpoint, the student and the teacher are scored greedily on the held-out levels
   (``held_out.num_tasks``, 200, seeds never trained on), scoring not counted in the time.

Minutes are wall-clock from each arm's process start (imports, server start, everything) to the moment
a checkpoint was written, on whatever the machine is doing: the script prints ``os.getloadavg()`` at
each phase so a figure on a shared machine can be read for what it is. It prints a table per arm
(minutes, steps, held-out success and its paired SE against the student), the gap the best checkpoint
within the budget closes, ``(distilled - student) / (teacher - student)``, with its paired standard
error (delta method over the same levels), for the last checkpoint within the budget (what the target is
judged on) and for the best one (picked after the fact, so flattering), and writes ``<out>/distill.png``: held-out
success against
minutes for both arms, with the student's and the teacher's levels and the 75%-of-the-gap line.
Exit status 0 when distillation closes >= ``--target`` of the gap within the budget.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SFT_PRESET = [
    "data.train_batch_size=16",
    "data.micro_batch_size_per_gpu=16",
    "optim.lr=3.0e-3",
    "optim.weight_decay=0.0",
    "optim.warmup_steps_ratio=0.05",
    "optim.min_lr_ratio=0.1",
    "data.env=sokoban",
]


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min) / {five:.1f} (5 min) on {os.cpu_count()} cores"


def run_until(cmd: list[str], log: Path, budget_s: float | None) -> tuple[float, bool]:
    """Run ``cmd`` (its own process group) until it ends or ``budget_s`` passes; (seconds, stopped)."""
    print("$", " ".join(cmd), f"> {log}", flush=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "RAY_AUTH_MODE": "disabled",
    }
    started = time.time()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=budget_s)
            stopped = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            stopped = True
    if proc.returncode not in (0, -signal.SIGTERM, -signal.SIGKILL) and not stopped:
        raise SystemExit(f"{cmd[3]} failed (exit {proc.returncode}); see {log}")
    return time.time() - started, stopped


def checkpoints(run_dir: Path, started: float) -> list[tuple[int, float, Path]]:
    """(step, minutes since ``started``, directory) of every complete checkpoint in ``run_dir``."""
    out = []
    for d in run_dir.glob("global_step_*"):
        state = d / "trainer_state.pt"
        if state.exists() and (d / "actor" / "model.pt").exists():
            out.append((int(d.name.rsplit("_", 1)[1]), (state.stat().st_mtime - started) / 60, d))
    return sorted(out)


def export(checkpoint: Path, base_model: Path) -> Path:
    """The checkpoint's weights as a Hugging Face directory (config and tokenizer from ``base_model``)."""
    target = checkpoint / "hf"
    if (target / "config.json").exists():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    model.load_state_dict(torch.load(checkpoint / "actor" / "model.pt", map_location="cpu"))
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(base_model).save_pretrained(target)
    return target


def score(model: Path, cache: Path, label: str) -> list[float]:
    """Greedy success per held-out level (cached in ``cache``)."""
    if cache.exists():
        return json.loads(cache.read_text())["per_task"]
    from agentgym.stages.held_out import score_model
    from agentgym.trainer.config import load_config

    cfg = load_config(env="sokoban", warn=False)
    result = score_model(cfg, str(model), 0.0, label, show_progress=False)
    cache.write_text(json.dumps({"model": str(model), "per_task": result.per_task, "seconds": result.seconds}))
    print(f"  {label}: {result.success:.3f} held-out greedy ({result.seconds:.0f} s to score; {load()})", flush=True)
    return result.per_task


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def paired_se(a: list[float], b: list[float]) -> float:
    d = [x - y for x, y in zip(a, b, strict=True)]
    m = mean(d)
    return math.sqrt(sum((x - m) ** 2 for x in d) / max(len(d) - 1, 1) / len(d))


def gap_closed(student: list[float], after: list[float], teacher: list[float]) -> tuple[float, float]:
    """``(after - student) / (teacher - student)`` over the same levels, and its delta-method SE."""
    a = [x - s for x, s in zip(after, student, strict=True)]
    b = [t - s for t, s in zip(teacher, student, strict=True)]
    if mean(b) <= 0:
        return float("nan"), float("nan")
    r = mean(a) / mean(b)
    resid = [x - r * y for x, y in zip(a, b, strict=True)]
    m = mean(resid)
    var = sum((x - m) ** 2 for x in resid) / max(len(resid) - 1, 1)
    return r, math.sqrt(var / len(resid)) / mean(b)


def plot(
    path: Path, arms: dict[str, list[tuple[float, float]]], student: float, teacher: float, budget: float, target: float
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (name, points), style in zip(arms.items(), ("o-", "s--"), strict=False):
        xs, ys = [0.0] + [p[0] for p in points], [student] + [p[1] for p in points]
        ax.plot(xs, ys, style, label=name)
    ax.axhline(teacher, color="green", lw=1, ls=":", label=f"teacher {teacher:.3f}")
    ax.axhline(student, color="grey", lw=1, ls=":", label=f"student start {student:.3f}")
    ax.axhline(student + target * (teacher - student), color="red", lw=0.8, ls="-.", label=f"{target:.0%} of the gap")
    ax.axvline(budget, color="black", lw=0.8, alpha=0.5)
    ax.set_xlabel("wall-clock minutes from the arm's start (scoring not counted)")
    ax.set_ylabel("held-out greedy success (200 levels)")
    ax.set_title("Sokoban: on-policy distillation vs more SFT, from the same student")
    ax.legend(loc="center right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", required=True, help="the main job's final model (RUN/huggingface)")
    parser.add_argument("--demos", required=True, help="the main job's demos (RUN/warm_start/demos/demos.jsonl)")
    parser.add_argument("--out", default="runs/distill-bench")
    parser.add_argument("--start-steps", type=int, default=100)
    parser.add_argument("--budget-min", type=float, default=10.0)
    parser.add_argument("--save-every", type=int, default=5, help="distill arm: steps between checkpoints")
    parser.add_argument(
        "--sft-total", type=int, default=600, help="the main job's SFT steps (configs/env/sokoban.yaml)"
    )
    parser.add_argument("--sft-save-every", type=int, default=50, help="sft arm: steps between checkpoints")
    parser.add_argument("--env-coef", type=float, default=0.0)
    parser.add_argument("--kl-coef", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1.0e-3, help="the distill arm's learning rate")
    parser.add_argument("--target", type=float, default=0.75)
    parser.add_argument("--arms", default="distill,sft", help="which arms to run (comma-separated)")
    parser.add_argument("overrides", nargs="*", help="extra KEY=VALUE overrides for the distill arm")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    budget_s = args.budget_min * 60
    print(f"distill benchmark in {out}; {load()}", flush=True)

    # 1. the student
    student_dir = out / "student"
    if not (student_dir / "huggingface" / "config.json").exists():
        seconds, _ = run_until(
            [
                py,
                "-m",
                "agentgym.cli",
                "sft",
                f"data.train_files={args.demos}",
                "model.partial_pretrain=tiny",
                f"trainer.total_training_steps={args.start_steps}",
                f"trainer.default_local_dir={student_dir}",
                "trainer.logger=[jsonl]",
                *SFT_PRESET,
            ],
            out / "student.log",
            None,
        )
        print(f"student: {args.start_steps} SFT steps in {seconds:.0f} s; {load()}", flush=True)
    student_model = student_dir / "huggingface"

    # 2. the distill arm
    arms_meta: dict[str, dict] = {}
    wanted = [a.strip() for a in args.arms.split(",") if a.strip()]
    distill_dir = out / "distill"
    if "distill" in wanted and not (out / "distill.json").exists():
        started = time.time()
        seconds, stopped = run_until(
            [
                py,
                "-m",
                "agentgym.cli",
                "train",
                "--env",
                "sokoban",
                "warm_start.enable=false",
                "held_out.enable=false",
                f"actor_rollout_ref.model.path={student_model}",
                "distillation.enable=true",
                f"distillation.teacher.path={Path(args.teacher).resolve()}",
                f"distillation.env_coef={args.env_coef}",
                f"distillation.kl_coef={args.kl_coef}",
                f"actor_rollout_ref.actor.optim.lr={args.lr}",
                "trainer.total_training_steps=1000",
                f"trainer.save_freq={args.save_every}",
                "trainer.test_freq=-1",
                "trainer.val_before_train=false",
                "trainer.save_hf_model=false",
                "trainer.logger=[jsonl]",
                "actor_rollout_ref.actor.checkpoint.save_contents=[model]",
                f"trainer.default_local_dir={distill_dir}",
                *args.overrides,
            ],
            out / "distill.log",
            budget_s,
        )
        (out / "distill.json").write_text(
            json.dumps({"started": started, "seconds": seconds, "stopped": stopped, "load": load()})
        )
    # 3. the sft arm
    sft_dir = out / "sft"
    if "sft" in wanted and not (out / "sft.json").exists():
        steps = max(1, args.sft_total - args.start_steps)
        started = time.time()
        seconds, stopped = run_until(
            [
                py,
                "-m",
                "agentgym.cli",
                "sft",
                f"data.train_files={args.demos}",
                f"model.partial_pretrain={student_model}",
                f"trainer.total_training_steps={steps}",
                f"trainer.save_freq={args.sft_save_every}",
                f"trainer.default_local_dir={sft_dir}",
                "trainer.logger=[jsonl]",
                "trainer.seed=1",
                *SFT_PRESET,
                "optim.warmup_steps_ratio=0.0",
            ],
            out / "sft.log",
            budget_s,
        )
        (out / "sft.json").write_text(
            json.dumps(
                {"started": started, "seconds": seconds, "stopped": stopped, "planned_steps": steps, "load": load()}
            )
        )

    # 4. scores
    print(f"scoring on the held-out levels; {load()}", flush=True)
    student = score(student_model, out / "score_student.json", "student")
    teacher = score(Path(args.teacher), out / "score_teacher.json", "teacher")
    curves: dict[str, list[tuple[float, float]]] = {}
    best: dict[str, tuple[float, list[float], int, float]] = {}
    last: dict[str, tuple[float, list[float], int, float]] = {}
    for name, run_dir in (("distill", distill_dir), ("sft", sft_dir)):
        meta_file = out / f"{name}.json"
        if not meta_file.exists():
            continue
        meta = json.loads(meta_file.read_text())
        arms_meta[name] = meta
        points = []
        print(
            f"\n{name} arm: {meta['seconds'] / 60:.1f} min, {'stopped at the budget' if meta['stopped'] else 'ended'}"
            f" ({meta['load']} at its end)"
        )
        print(f"  {'step':>5} {'minutes':>8} {'held-out':>9} {'vs student':>18}")
        for step, minutes, ckpt in checkpoints(run_dir, meta["started"]):
            per_task = score(export(ckpt, student_model), ckpt / "score.json", f"{name} step {step}")
            gain, se = mean(per_task) - mean(student), paired_se(per_task, student)
            print(f"  {step:>5} {minutes:>8.2f} {mean(per_task):>9.3f} {gain:>+9.3f} ± {se:.3f}", flush=True)
            points.append((minutes, mean(per_task)))
            if minutes <= args.budget_min:
                last[name] = (mean(per_task), per_task, step, minutes)
                if name not in best or mean(per_task) > best[name][0]:
                    best[name] = (mean(per_task), per_task, step, minutes)
        curves[name] = points

    s, t = mean(student), mean(teacher)
    print(
        f"\nstudent {s:.3f}, teacher {t:.3f} held-out greedy ({len(student)} levels); teacher - student "
        f"{t - s:+.3f} ± {paired_se(teacher, student):.3f} (paired)"
    )
    ok = False
    for name in best:
        for which, (value, per_task, step, minutes) in (("last", last[name]), ("best", best[name])):
            closed, se = gap_closed(student, per_task, teacher)
            print(
                f"{name}: {which} checkpoint within {args.budget_min:g} min: {value:.3f} at step {step} ({minutes:.1f} "
                f"min): closes {closed:.0%} ± {se:.0%} of the gap (paired SE); teacher - it {t - value:+.3f} ± "
                f"{paired_se(teacher, per_task):.3f}"
            )
            ok = ok or (name == "distill" and which == "last" and closed >= args.target)
    print("(the best of several checkpoints is picked after the fact and flatters; the target is judged on the last)")
    if curves:
        plot(
            out / "distill.png",
            {
                f"on-policy distillation (env_coef {args.env_coef:g})": curves.get("distill", []),
                "more SFT on the demos": curves.get("sft", []),
            },
            s,
            t,
            args.budget_min,
            args.target,
        )
        print(f"plot: {out / 'distill.png'}")
    print(
        f"target: distillation closes >= {args.target:.0%} of the gap within {args.budget_min:g} min: "
        f"{'met' if ok else 'not met'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
