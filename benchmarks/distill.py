"""On-policy distillation on Sokoban: how much of the student-teacher gap does each way of learning from a
teacher close per CPU minute?

    python benchmarks/distill.py --teacher RUN/huggingface --demos RUN/warm_start/demos/demos.jsonl
    python benchmarks/distill.py ... --seeds 1 2 3 --minutes 10          # the issue's measurement
    python benchmarks/distill.py ... --minutes 1 --held-out-tasks 8      # a smoke run of the whole path

``RUN`` is a finished ``agentgym train --env sokoban`` (the README's main job): its final model is the
teacher, its demos train the student. The phases, each kept in ``--out`` and skipped when already there:

1. **student**: ``agentgym sft`` from the tiny model, ``--start-steps`` (200) steps on the demos at the
   main job's SFT settings (``warm_start.sft`` of configs/env/sokoban.yaml: batch 16, peak rate 3e-3),
   so it already reads the board; the teacher must be at least ``--min-gap`` (0.25) above it on the
   held-out levels, else the benchmark stops and says so (a smaller gap measures noise);
2. per seed (``trainer.seed``), three **arms**, each from the student, each stopped when its process tree
   has used ``--minutes`` CPU minutes (user + system time of every process it started, read from
   ``/proc``; the same budget for every arm, whatever else the shared machine is doing):

   * ``sampled``: ``agentgym train --env sokoban distillation.enable=true`` with the teacher as
     ``distillation.teacher.path``, ``loss_mode=sampled`` (the sampled token's reverse KL in the
     advantage), ``env_coef`` ``--env-coef`` (0: pure distillation);
   * ``topk``: the same with ``loss_mode=topk`` (the reverse KL over the teacher's top-``--topk`` tokens
     and a tail bucket, in the actor's loss);
   * ``forward``: ``loss_mode=topk`` with ``distillation.beta=0`` (GKD's forward KL over the same buckets:
     the teacher's distribution as soft labels on the student's own states);
   * ``sft``: off-policy distillation: the teacher samples ``--teacher-tasks`` episodes (temperature 1,
     seeds from 3,000,000: neither demos, RL nor held-out levels) with ``agentgym rollout``, and
     ``agentgym sft`` trains the student on them; the sampling's CPU time is counted in the arm's budget.

   The distill arms run with ``trainer.use_ray=false`` (every process in one tree, so the CPU count is
   complete) and checkpoint every ``--save-every`` steps, the sft arm every ``--sft-save-every``;
3. every checkpoint, the student and the teacher are scored greedily on the held-out levels
   (``--held-out-tasks``, 200: seeds never trained on); scoring is not counted.

It prints per arm and seed the checkpoints with their CPU minutes, held-out success and the fraction
of the gap closed, ``(model - student) / (teacher - student)`` with its paired standard error (delta
method over the same levels), then per arm the gap closed by the last checkpoint within the budget
(mean and spread over seeds), the gap closed per CPU minute, and the CPU minutes each seed needed to
close half the gap; ``<out>/distill.png`` draws gap closed against CPU minutes. Exit status 0 when,
on every seed, one on-policy arm (the same one) closes >= ``--target`` (0.5) of the gap within the budget
and more per CPU minute than the sft arm.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import signal
import statistics
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
TEACHER_SEED_START = 3_000_000
ARMS = ("sampled", "topk", "forward", "sft")
ON_POLICY = ("sampled", "topk", "forward")
TICK = os.sysconf("SC_CLK_TCK")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min) / {five:.1f} (5 min) on {os.cpu_count()} cores"


def session_cpu_s(sid: int) -> float:
    """CPU seconds (user + system, with their reaped children's) of the live processes of session ``sid``."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(rest[3]) == sid:
            total += sum(int(x) for x in rest[11:15])
    return total / TICK


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_cpu_budget(cmd: list[str], log: Path, budget_s: float | None) -> tuple[list[tuple[float, float]], bool]:
    """Run ``cmd`` (a session of its own, niced) until it ends or its processes have used ``budget_s`` CPU
    seconds; returns the trace ``[(wall time, CPU seconds so far)]`` (about one point a second) and
    whether it was stopped."""
    print("$", " ".join(cmd), f"> {log}", flush=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "RAY_AUTH_MODE": "disabled",
    }
    before = children_cpu_s()
    trace = [(time.time(), 0.0)]
    stopped = False
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=nice
        )
        while proc.poll() is None:
            time.sleep(1.0)
            cpu = max(trace[-1][1], session_cpu_s(proc.pid))
            trace.append((time.time(), cpu))
            if budget_s is not None and cpu >= budget_s and not stopped:
                stopped = True
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    trace.append((time.time(), max(trace[-1][1], children_cpu_s() - before)))
    if proc.returncode != 0 and not stopped:
        raise SystemExit(f"{cmd[3]} failed (exit {proc.returncode}); see {log}")
    return trace, stopped


def nice() -> None:
    """The arm at niceness 10 at least: a benchmark started niced (``nice -n 10``, as the shared machine asks)
    would otherwise put its arms at 19, where other work at 10 leaves them a few percent of a core."""
    os.nice(max(0, 10 - os.nice(0)))


def cpu_at(trace: list[tuple[float, float]], when: float) -> float:
    """The CPU seconds of ``trace`` at wall time ``when`` (the last point not after it)."""
    value = 0.0
    for t, cpu in trace:
        if t > when:
            break
        value = cpu
    return value


def checkpoints(run_dir: Path) -> list[tuple[int, float, Path]]:
    """(step, wall time written, directory) of every complete checkpoint in ``run_dir``."""
    out = []
    for d in run_dir.glob("global_step_*"):
        state = d / "trainer_state.pt"
        if state.exists() and (d / "actor" / "model.pt").exists():
            out.append((int(d.name.rsplit("_", 1)[1]), state.stat().st_mtime, d))
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


def score(model: Path, cache: Path, label: str, tasks: int) -> list[float]:
    """Greedy success per held-out level (cached in ``cache``)."""
    if cache.exists():
        cached = json.loads(cache.read_text())
        if len(cached["per_task"]) == tasks:
            return cached["per_task"]
    from agentgym.stages.held_out import score_model
    from agentgym.trainer.config import load_config

    cfg = load_config(env="sokoban", overrides=[f"held_out.num_tasks={tasks}"], warn=False)
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


def sokoban_rollout_args() -> list[str]:
    """``agentgym rollout`` flags that play the main job's Sokoban (its env kwargs, turn and token limits)."""
    from agentgym.trainer.config import load_config

    cfg = load_config(env="sokoban", warn=False)
    out = ["--env", "sokoban", "--env-executor", str(cfg.env.executor)]
    for key, value in cfg.env.kwargs.items():
        text = json.dumps(list(value) if not isinstance(value, (str, int, float, bool)) else value)
        out += ["--env-arg", f"{key}={value}" if isinstance(value, str) else f"{key}={text}"]
    rollout = cfg.actor_rollout_ref.rollout
    out += ["--max-tokens", str(rollout.max_tokens_per_turn)]
    out += ["--max-turns", str(rollout.multi_turn.max_assistant_turns)]
    out += ["--prompt-length", str(cfg.data.max_prompt_length), "--response-length", str(cfg.data.max_response_length)]
    return out


def teacher_path(args: argparse.Namespace) -> str:
    """``--teacher`` as the child processes read it (``tiny``, the built-in model, stays a name)."""
    return args.teacher if args.teacher == "tiny" else str(Path(args.teacher).resolve())


def arm_command(arm: str, args: argparse.Namespace, student: Path, run_dir: Path, seed: int) -> list[str]:
    py = sys.executable
    if arm == "sft":
        return [
            py,
            "-m",
            "agentgym.cli",
            "sft",
            f"data.train_files={run_dir / 'teacher_samples.jsonl'}",
            f"model.partial_pretrain={student}",
            f"trainer.total_training_steps={args.sft_steps}",
            f"trainer.save_freq={args.sft_save_every}",
            f"trainer.default_local_dir={run_dir}",
            "trainer.logger=[jsonl]",
            f"trainer.seed={seed}",
            *SFT_PRESET,
            "optim.warmup_steps_ratio=0.0",
            f"data.train_batch_size={min(16, args.teacher_tasks)}",  # a short smoke run samples fewer
            f"data.micro_batch_size_per_gpu={min(16, args.teacher_tasks)}",
        ]
    return [
        py,
        "-m",
        "agentgym.cli",
        "train",
        "--env",
        "sokoban",
        "warm_start.enable=false",
        "held_out.enable=false",
        f"actor_rollout_ref.model.path={student}",
        "distillation.enable=true",
        f"distillation.teacher.path={teacher_path(args)}",
        f"distillation.loss_mode={'sampled' if arm == 'sampled' else 'topk'}",
        f"distillation.beta={0.0 if arm == 'forward' else 1.0}",
        f"distillation.topk={args.topk}",
        f"distillation.env_coef={args.env_coef}",
        f"distillation.kl_coef={args.kl_coef}",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        f"trainer.seed={seed}",
        "trainer.use_ray=false",
        "trainer.total_training_steps=1000",
        f"trainer.save_freq={args.save_every}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.save_hf_model=false",
        "trainer.logger=[jsonl]",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model]",
        f"trainer.default_local_dir={run_dir}",
        *args.overrides,
    ]


def run_arm(arm: str, args: argparse.Namespace, student: Path, out: Path, seed: int) -> dict:
    """The arm's run (kept: ``<out>/<arm>-s<seed>.json`` holds its CPU trace)."""
    meta_file = out / f"{arm}-s{seed}.json"
    if meta_file.exists():
        return json.loads(meta_file.read_text())
    run_dir = out / f"{arm}-s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    budget = args.minutes * 60
    trace: list[tuple[float, float]] = []
    stopped = False
    if arm == "sft":  # the teacher's samples first, on the arm's budget
        samples = run_dir / "teacher_samples.jsonl"
        trace, stopped = run_cpu_budget(
            [
                sys.executable,
                "-m",
                "agentgym.cli",
                "rollout",
                "--model",
                teacher_path(args),
                *sokoban_rollout_args(),
                "-n",
                "1",
                "--tasks",
                str(args.teacher_tasks),
                "--seed",
                str(TEACHER_SEED_START + 100_000 * seed),
                "--temperature",
                "1.0",
                "--device",
                "cpu",
                "--out",
                str(samples),
            ],
            out / f"{arm}-s{seed}-samples.log",
            budget,
        )
        if stopped:
            print(f"  sft arm, seed {seed}: the teacher's sampling used the whole budget; no SFT", flush=True)
    if not stopped:
        offset = trace[-1][1] if trace else 0.0
        more, stopped = run_cpu_budget(
            arm_command(arm, args, student, run_dir, seed), out / f"{arm}-s{seed}.log", budget - offset
        )
        trace += [(t, offset + cpu) for t, cpu in more]
    meta = {"trace": trace, "stopped": stopped, "load": load(), "cpu_min": trace[-1][1] / 60}
    meta_file.write_text(json.dumps(meta))
    return meta


def plot(path: Path, curves: dict[str, list[tuple[float, float]]], budget: float, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {"sampled": "o-", "topk": "s-", "forward": "D-", "sft": "^--"}
    for name, points in curves.items():
        xs, ys = [0.0] + [p[0] for p in points], [0.0] + [p[1] for p in points]
        ax.plot(xs, ys, styles.get(name.split(" ")[0], "o-"), label=name, alpha=0.8)
    ax.axhline(1.0, color="green", lw=1, ls=":", label="the teacher")
    ax.axhline(target, color="red", lw=0.8, ls="-.", label=f"{target:.0%} of the gap")
    ax.axvline(budget, color="black", lw=0.8, alpha=0.5)
    ax.set_xlabel("CPU minutes of the arm's processes (scoring not counted)")
    ax.set_ylabel("fraction of the student-teacher gap closed (held-out greedy)")
    ax.set_title("Sokoban: on-policy distillation (sampled, top-k, forward) vs SFT on the teacher's samples")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", required=True, help="the main job's final model (RUN/huggingface)")
    parser.add_argument("--demos", required=True, help="the main job's demos (RUN/warm_start/demos/demos.jsonl)")
    parser.add_argument("--out", default="runs/distill-bench")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--minutes", type=float, default=10.0, help="each arm's budget in CPU minutes")
    parser.add_argument("--start-steps", type=int, default=200, help="the student's SFT steps on the demos")
    parser.add_argument("--min-gap", type=float, default=0.25, help="teacher - student needed on held-out levels")
    parser.add_argument("--held-out-tasks", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=5, help="distill arms: steps between checkpoints")
    parser.add_argument("--topk", type=int, default=20)
    parser.add_argument("--env-coef", type=float, default=0.0)
    parser.add_argument("--kl-coef", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1.0e-3, help="the distill arms' learning rate")
    parser.add_argument("--teacher-tasks", type=int, default=512, help="sft arm: episodes the teacher samples")
    parser.add_argument("--sft-steps", type=int, default=500, help="sft arm: its schedule's length")
    parser.add_argument("--sft-save-every", type=int, default=25, help="sft arm: steps between checkpoints")
    parser.add_argument("--target", type=float, default=0.5)
    parser.add_argument("overrides", nargs="*", help="extra KEY=VALUE overrides for the distill arms")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(f"distill benchmark in {out}; {load()}", flush=True)

    # 1. the student, and the gap it leaves
    student_dir = out / "student"
    if not (student_dir / "huggingface" / "config.json").exists():
        trace, _ = run_cpu_budget(
            [
                sys.executable,
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
        print(f"student: {args.start_steps} SFT steps in {trace[-1][1] / 60:.1f} CPU min; {load()}", flush=True)
    student_model = student_dir / "huggingface"
    n = args.held_out_tasks
    student = score(student_model, out / "score_student.json", "student", n)
    teacher = score(Path(teacher_path(args)), out / "score_teacher.json", "teacher", n)
    s, t = mean(student), mean(teacher)
    print(
        f"student {s:.3f}, teacher {t:.3f} held-out greedy ({n} levels): teacher - student {t - s:+.3f} ± "
        f"{paired_se(teacher, student):.3f} (paired)",
        flush=True,
    )
    if t - s < args.min_gap:
        print(
            f"the teacher is not {args.min_gap:g} above the student: the gap is too small to measure (train the "
            "student for fewer --start-steps, or take a stronger teacher; --min-gap 0 runs anyway)"
        )
        return 2

    # 2. the arms, 3. their checkpoints
    results: dict[str, dict[int, list[tuple[int, float, float, float]]]] = {a: {} for a in args.arms}
    for seed in args.seeds:
        for arm in args.arms:
            print(f"\n{arm} arm, seed {seed}: {args.minutes:g} CPU minutes; {load()}", flush=True)
            meta = run_arm(arm, args, student_model, out, seed)
            trace = [tuple(p) for p in meta["trace"]]
            print(
                f"  {meta['cpu_min']:.1f} CPU min, {'stopped at the budget' if meta['stopped'] else 'ended'} "
                f"({meta['load']} at its end)"
            )
            print(f"  {'step':>5} {'CPU min':>8} {'held-out':>9} {'gap closed':>16}")
            rows = []
            for step, written, ckpt in checkpoints(out / f"{arm}-s{seed}"):
                cpu_min = cpu_at(trace, written) / 60
                per_task = score(export(ckpt, student_model), ckpt / f"score{n}.json", f"{arm} s{seed} step {step}", n)
                closed, se = gap_closed(student, per_task, teacher)
                print(f"  {step:>5} {cpu_min:>8.2f} {mean(per_task):>9.3f} {closed:>9.0%} ± {se:.0%}", flush=True)
                rows.append((step, cpu_min, mean(per_task), closed))
            results[arm][seed] = rows

    # the summary: the last checkpoint within the budget
    print(f"\nstudent {s:.3f} -> teacher {t:.3f}; per arm, the last checkpoint within {args.minutes:g} CPU min:")
    print(f"  {'arm':<8} {'gap closed (seeds)':<28} {'mean':>6} {'per CPU min':>12} {'CPU min to half':>16}")
    per_minute: dict[str, dict[int, float]] = {}
    closed_at: dict[str, dict[int, float]] = {}
    for arm, seeds in results.items():
        closed, rates, halves = [], {}, []
        for seed, rows in seeds.items():
            within = [r for r in rows if r[1] <= args.minutes]
            last = within[-1] if within else None
            value = last[3] if last else 0.0
            closed.append(value)
            rates[seed] = value / last[1] if last and last[1] > 0 else 0.0
            half = next((r[1] for r in within if r[3] >= 0.5), None)
            halves.append("-" if half is None else f"{half:.1f}")
        per_minute[arm] = rates
        closed_at[arm] = dict(zip(seeds, closed, strict=True))
        spread = f" ± {statistics.stdev(closed):.0%}" if len(closed) > 1 else ""
        print(
            f"  {arm:<8} {' '.join(f'{c:.0%}' for c in closed):<28} {mean(closed) if closed else 0:>6.0%}{spread}"
            f" {mean(list(rates.values())) if rates else 0:>12.1%} {' '.join(halves):>16}"
        )
    curves = {
        f"{arm} s{seed}": [(r[1], r[3]) for r in rows] for arm, seeds in results.items() for seed, rows in seeds.items()
    }
    if any(curves.values()):
        plot(out / "distill.png", curves, args.minutes, args.target)
        print(f"plot: {out / 'distill.png'}")
    sft_rate = per_minute.get("sft", {})
    meets = [
        arm
        for arm in ON_POLICY
        if arm in results
        and all(
            closed_at[arm].get(seed, 0.0) >= args.target and per_minute[arm].get(seed, 0.0) > sft_rate.get(seed, 0.0)
            for seed in args.seeds
        )
    ]
    ok = bool(args.seeds) and "sft" in results and bool(meets)
    print(
        f"target: on every seed one on-policy arm closes >= {args.target:.0%} of the gap within {args.minutes:g} CPU "
        f"min, faster per CPU minute than SFT on the teacher's samples: "
        f"{'met by ' + ', '.join(meets) if ok else 'not met'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
