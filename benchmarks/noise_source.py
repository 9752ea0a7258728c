"""Is a CPU cell's run-to-run noise a property of the process or of the moment?

    .venv/bin/python benchmarks/noise_source.py [--processes 4] [--rounds 12] [--turn 1.5] [--batch 64]

Starts `processes` long-lived workers, each training the default study's single-device cell
(LeNet on 28x28 single-channel data resident in memory, Adam, the given batch) on the one core a
single-device CPU cell gets, with the study's allocator (dpstudy.util.allocator, `auto`). The
workers take turns: each round, every worker trains for `turn` seconds while the others wait, so
all of them see the machine at nearly the same moments. Then, over the turns after the first round:

- between processes: how far each worker's own mean throughput lies from the others' (CV of the
  per-process means), and a one-way ANOVA's F (between-process variance over within-process);
- within a process: the CV of its turns over time;
- moments: the correlation of consecutive workers' turns within a round (the machine drifting
  moves them together).

A large F with a small within-process CV says the noise is fixed when a process starts (more
processes per setting is the remedy, pyperf's advice); a high round-to-round correlation and a
large within-process CV say it is the machine moving over time (spacing and interleaving are).

One more worker takes its turn each round: the machine's floor (dpstudy.engine.reference, the floor's three
parts over the same `turn`; its copies of --copy-mib, 32 as in a cell's gauge), so that what the
floor sees can be held against what the cells see at the same moments: each part's CV over the
rounds and its correlation with the workers' mean. Measured here (3 workers, 14 rounds): the
32 MiB copies +0.76, the matmuls +0.24, the dispatch +0.33: memory traffic is what drifts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dpstudy.util import allocator  # noqa: E402

FLOOR = r"""
import os, sys
os.sched_setaffinity(0, [int(sys.argv[3])])
import torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[4])
from dpstudy.engine import reference as floor
cpu = torch.device("cpu")
parts = {"compute": floor.compute(cpu), "memory": floor.memory(cpu, int(sys.argv[5])), "dispatch": floor.dispatch(cpu)}
floor.timed_rates(parts, 0.5, cpu)
print("ready", flush=True)
for line in sys.stdin:
    rates = floor.timed_rates(parts, float(sys.argv[2]), cpu)
    print(" ".join(str(rates[name]) for name in ("compute", "memory", "dispatch")), flush=True)
"""
PARTS = ("compute", "memory", "dispatch")
WORKER = r"""
import os, sys, time
os.sched_setaffinity(0, [int(sys.argv[3])])
import torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[4])
from dpstudy.data.task import Task
from dpstudy.models import build
torch.manual_seed(0)
batch, turn = int(sys.argv[1]), float(sys.argv[2])
x, y = torch.randn(8000, 1, 28, 28), torch.randint(0, 10, (8000,))
model = build("lenet", Task.image(1, 28, 10))
opt = torch.optim.Adam(model.parameters(), lr=0.003)
loss_fn = torch.nn.CrossEntropyLoss()

def steps(n):
    for _ in range(n):
        i = torch.randint(0, 8000, (batch,))
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x[i]), y[i]).backward()
        opt.step()

steps(20)  # warm-up, as the steady window skips the first steps
print("ready", flush=True)
for line in sys.stdin:
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < turn:
        steps(5)
        done += 5 * batch
    print(done / (time.perf_counter() - start), flush=True)
"""


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else float("nan")


def anova_f(groups: list[list[float]]) -> float:
    """Between-group mean square over within-group mean square."""
    grand = statistics.fmean(v for g in groups for v in g)
    k, n = len(groups), sum(len(g) for g in groups)
    between = sum(len(g) * (statistics.fmean(g) - grand) ** 2 for g in groups) / (k - 1)
    within = sum((v - statistics.fmean(g)) ** 2 for g in groups for v in g) / (n - k)
    return between / within


def correlation(a: list[float], b: list[float]) -> float:
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True))
    return cov / (sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b)) ** 0.5


def turn(worker: subprocess.Popen) -> str:
    """One turn of `worker`: what it printed."""
    worker.stdin.write("go\n")
    worker.stdin.flush()
    return worker.stdout.readline()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--turn", type=float, default=1.5, help="seconds each worker trains per round")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--core", type=int, default=min(os.sched_getaffinity(0)))
    parser.add_argument("--allocator", default="auto", choices=allocator.CHOICES)
    parser.add_argument("--copy-mib", type=int, default=32, help="the floor's copies: 32 as a gauge, 256 as a job")
    args = parser.parse_args()
    if args.processes < 2 or args.rounds < 3:
        parser.error("--processes must be at least 2 and --rounds at least 3")
    setup = allocator.resolve(args.allocator)
    env = setup.environment(dict(os.environ))
    command = [sys.executable, "-c", WORKER, str(args.batch), str(args.turn), str(args.core), str(REPO)]
    workers = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(args.processes)
    ]
    reference = [sys.executable, "-c", FLOOR, str(args.batch), str(args.turn), str(args.core), str(REPO)]
    reference.append(str(args.copy_mib << 20))
    floor = subprocess.Popen(reference, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    for w in [*workers, floor]:
        if w.stdout.readline().strip() != "ready":
            sys.exit("a worker did not start")
    print(f"{args.processes} workers on core {args.core}, allocator {setup.describe()}, batch {args.batch}")
    rates: list[list[float]] = [[] for _ in workers]
    floors: list[list[float]] = []
    for r in range(args.rounds):
        for i, w in enumerate(workers):
            rates[i].append(float(turn(w)))
            if i == len(workers) // 2:  # the floor's turn in the middle of the round
                floors.append([float(v) for v in turn(floor).split()])
        told = "  ".join(f"{v[-1]:7.0f}" for v in rates)
        print(f"round {r + 1:2d}: {told}   floor " + " ".join(f"{v:8.2f}" for v in floors[-1]), flush=True)
    for w in [*workers, floor]:
        w.stdin.close()
        w.wait()
    kept = [v[1:] for v in rates]  # the first round: caches and pages still settling
    means = [statistics.fmean(v) for v in kept]
    within = [cv(v) for v in kept]
    pairs = [correlation(kept[i], kept[i + 1]) for i in range(len(kept) - 1)]
    print()
    for i, (m, c) in enumerate(zip(means, within, strict=True)):
        print(f"process {i}: mean {m:7.0f} samples/s, CV over its turns {c * 100:4.1f} %")
    print(f"between processes: CV of the means {cv(means) * 100:.1f} %, ANOVA F {anova_f(kept):.1f}")
    print(f"within a process: median CV {statistics.median(within) * 100:.1f} %")
    print(f"moments: median correlation of neighbouring workers' turns {statistics.median(pairs):+.2f}")
    moment = [statistics.fmean(column) for column in zip(*kept, strict=True)]
    print(f"the workers' mean per round: CV {cv(moment) * 100:.1f} %")
    for k, name in enumerate(PARTS):
        part = [f[k] for f in floors[1:]]
        print(
            f"floor {name:8s}: CV over the rounds {cv(part) * 100:4.1f} %, correlation with the workers' mean "
            f"{correlation(part, moment):+.2f}"
        )


if __name__ == "__main__":
    main()
