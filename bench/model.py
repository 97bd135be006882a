"""GEM model: jagged block attention vs padded full attention, linear scaling, FLOP/s, skip, context.

All in one run, each figure beside its baseline:
1. tokens/s of the block-attention layer on jagged input vs the same layer as padded
   full attention (``scaled_dot_product_attention`` with a padding mask), on a batch
   whose histories average ~1,000 tokens with a tail to 16,000 (target >= 3x);
2. forward time of the whole model for one user, 512 -> 65,536 tokens: log-log slope
   (target <= 1.15; printed as 1.15 / slope) beside full attention's slope;
3. achieved FLOP/s of a batched forward (torch's flop counter) over this machine's
   fp32 matmul peak measured here with a large ``torch.mm`` (target >= 40%);
4. component skip on vs off: forward FLOPs saved (target >= 40%) and the holdout click
   AUC it costs (target: at most 0.002 at the upper end of its 90% interval), both trained
   on the same examples of one generated world (40,000 users, so the last day holds
   ~2,600 clicks) with eight seeds: the mean loss over seeds, each seed's, and an
   interval over holdout rows (paired bootstrap) and seeds;
5. max_len 256 vs 1,024 vs 4,096 on the same data, two seeds each, on a world where old
   interests matter (``generate --niche-affinity``: each user likes a niche category as
   much as a main interest but is shown it on 3% of impressions, so in a long history
   its evidence is mostly far back): holdout click AUC on the rows whose history is
   longer than 256 events (where a longer context can read more) and on all rows, and
   each longer context's gain with its interval;
and the model against its baseline per task (for conversion also over every seed).
The headline (1) is printed last. QUICK=1 shrinks every size (a few minutes: seven
trainings); one torch thread per training unless BENCH_THREADS says otherwise, two
trainings at once unless BENCH_JOBS says otherwise.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import torch

from bench.common import QUICK, WORK, generate, result
from bench.model_kernels import DEVICE, bench_attention, bench_flops, bench_scaling
from pipelines.model.config import GemConfig
from pipelines.model.train.loop import TrainConfig, load_predictions, train_model
from pipelines.model.train.metrics import auc, seeded_auc_gain

#: Seeds (init and batch order) of each component-skip setting; both settings see the same examples.
SKIP_SEEDS = (0, 1) if QUICK else tuple(range(8))
#: (users, days) of the skip world: the last day's clicks bound how precisely an AUC loss is known.
SKIP_WORLD = (3000, 14) if QUICK else (40000, 14)
#: Seeds of each context length, and the lengths compared (same examples and holdout).
CONTEXT_SEEDS = (0,) if QUICK else (0, 1)
CONTEXT_LENGTHS = (256, 1024, 4096)
#: The context world: the default one plus niche interests of this affinity (generate --niche-affinity).
CONTEXT_WORLD = (3000, 14) if QUICK else (20000, 14)
NICHE_AFFINITY = 16.0


def features_dir(users: int, days: int, niche: float = 0.0) -> str:
    """Features of a generated world (``niche``: its --niche-affinity, 0 = the default world)."""
    root = WORK / (f"model-{users}u-{days}d" + (f"-niche{niche:g}" if niche else ""))
    flags = ("--niche-affinity", str(niche)) if niche else ()
    events = generate(users, days, root / "events.parquet", flags=flags)
    out = root / "features"
    if not (out / "summary.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pipelines",
                "features",
                "--input",
                str(events),
                "--output",
                str(out),
                "--overwrite",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return str(out)


def _line(name: str, m: dict, seconds: float) -> None:
    print(
        f"[4/5] {name}: click AUC {m['model']['click']['auc']:.4f} NE {m['model']['click']['ne']:.4f} "
        f"(baseline AUC {m['baseline']['click']['auc']:.4f} NE {m['baseline']['click']['ne']:.4f}), "
        f"conversion AUC {m['model']['conversion']['auc']:.4f} NE {m['model']['conversion']['ne']:.4f} "
        f"(baseline {m['baseline']['conversion']['auc']:.4f} / {m['baseline']['conversion']['ne']:.4f}); "
        f"{len_note(m)} in {seconds:.0f} s",
        flush=True,
    )


def _train_one(data: str, name: str, config: GemConfig, tc: TrainConfig, threads: int) -> tuple[str, dict, float]:
    """One training in a worker process (its own torch thread setting)."""
    torch.set_num_threads(threads)
    started = time.perf_counter()
    metrics = train_model(data, WORK / "model-runs" / name, config, tc)
    return name, metrics, time.perf_counter() - started


class Run(NamedTuple):
    """One training of the quality section: its features, model and training settings."""

    data: str
    config: GemConfig
    tc: TrainConfig


def bench_quality(base: GemConfig) -> dict[str, dict]:
    """Trainings, each pair of compared settings on one training sample and holdout
    (``data_seed`` fixed; the seed varies init and order): component skip on/off with
    SKIP_SEEDS seeds each on the default world, then max_len 256 / 1,024 / 4,096 with
    CONTEXT_SEEDS seeds on a smaller training budget (long contexts cost more per example)
    on a world with niche interests (``NICHE_AFFINITY``: liked but rarely shown, so their
    evidence lies far back in a long history). BENCH_JOBS trainings run at once (2 by
    default: one per core, each on the bench's thread count)."""
    skip_data = features_dir(*SKIP_WORLD)
    context_data = features_dir(*CONTEXT_WORLD, niche=NICHE_AFFINITY)
    # the holdout keeps every positive of the last day (negatives sampled and weighted back)
    skip_tc = TrainConfig(
        epochs=1,
        max_examples=4000 if QUICK else 30000,
        max_holdout=8000 if QUICK else 60000,
        progress=False,
        seed=0,
        data_seed=0,
    )
    context_tc = dataclasses.replace(
        skip_tc, max_examples=2000 if QUICK else 12000, max_holdout=8000 if QUICK else 30000
    )
    runs: dict[str, Run] = {}
    for seed in SKIP_SEEDS:
        tc = dataclasses.replace(skip_tc, seed=seed)
        runs[f"skip_on_{seed}"] = Run(skip_data, base, tc)
        runs[f"skip_off_{seed}"] = Run(skip_data, base.replace(component_skip=False), tc)
    for seed in CONTEXT_SEEDS:
        for max_len in CONTEXT_LENGTHS:
            runs[f"max_len_{max_len}_{seed}"] = Run(
                context_data, base.replace(max_len=max_len), dataclasses.replace(context_tc, seed=seed)
            )
    metrics = {}
    jobs, threads = int(os.environ.get("BENCH_JOBS", "2")), torch.get_num_threads()
    # longest first, so the last job to start is a short one
    order = sorted(runs, key=lambda n: -runs[n].config.max_len * (runs[n].tc.max_examples or 0))
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_train_one, runs[n].data, n, runs[n].config, runs[n].tc, threads) for n in order]
        for future in as_completed(futures):
            name, metrics[name], seconds = future.result()
            _line(name, metrics[name], seconds)
    return metrics


def predictions(names: list[str]) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    """The shared holdout (labels, weights, lengths of the first run) and every run's predictions."""
    runs = [load_predictions(WORK / "model-runs" / name) for name in names]
    for run in runs[1:]:
        assert np.array_equal(run["weights"], runs[0]["weights"]), "runs must share one holdout"
    return runs[0], runs


def skip_auc_cost() -> dict:
    """Click AUC lost by skipping (AUC off - AUC on), mean over SKIP_SEEDS seeds trained on the
    same examples, with a 90% interval over holdout rows and seeds (``seeded_auc_gain``)."""
    holdout, on = predictions([f"skip_on_{s}" for s in SKIP_SEEDS])
    _, off = predictions([f"skip_off_{s}" for s in SKIP_SEEDS])
    return seeded_auc_gain(
        holdout["clicked"], [r["model_clicked"] for r in off], [r["model_clicked"] for r in on], holdout["weights"]
    )


def context_gains() -> tuple[dict[int, dict], dict[int, dict], dict[str, float]]:
    """Click AUC per max_len (mean over seeds) on every holdout row and on the rows whose
    prefix is longer than the shortest context (where a longer one can see more), and
    each longer context's gain over the shortest on those rows, with its 90% interval."""
    shortest = CONTEXT_LENGTHS[0]
    runs = {n: predictions([f"max_len_{n}_{s}" for s in CONTEXT_SEEDS])[1] for n in CONTEXT_LENGTHS}
    holdout = runs[shortest][0]
    long = holdout["history_length"] > shortest
    labels, weights = holdout["clicked"], holdout["weights"]
    mean_auc = {
        n: {
            "all": float(np.mean([auc(labels, r["model_clicked"], weights) for r in rs])),
            "long": float(np.mean([auc(labels[long], r["model_clicked"][long], weights[long]) for r in rs])),
        }
        for n, rs in runs.items()
    }
    gains = {
        n: seeded_auc_gain(
            labels[long],
            [r["model_clicked"][long] for r in runs[n]],
            [r["model_clicked"][long] for r in runs[shortest]],
            weights[long],
        )
        for n in CONTEXT_LENGTHS[1:]
    }
    counts = {
        "rows": int(long.sum()),
        "clicks": int(labels[long].sum()),
        "users": len(np.unique(holdout["user_id"][long])),
        "share": float(weights[long].sum() / weights.sum()),
    }
    return mean_auc, gains, counts


def conversion_vs_baseline() -> dict:
    """The model's conversion AUC gain over the baseline across the skip-on seeds (the
    baseline is the same for every seed: same training sample)."""
    holdout, on = predictions([f"skip_on_{s}" for s in SKIP_SEEDS])
    return seeded_auc_gain(
        holdout["converted"],
        [r["model_converted"] for r in on],
        [r["baseline_converted"] for r in on],
        holdout["weights"],
    )


def len_note(m: dict) -> str:
    return (
        f"{m['data']['train_examples']} examples (mean {m['data']['mean_train_prefix_tokens']:.0f} tokens), "
        f"{m['data']['holdout_examples']} held out"
    )


def _seeds(n: int) -> str:
    return f"{n} seed" + ("s" if n > 1 else "")


def _interval(g: dict) -> str:
    return (
        f"{g['gain']:+.4f} (90% interval {g['low']:+.4f}..{g['high']:+.4f} over holdout rows and "
        f"{_seeds(g['seeds'])}; per seed " + ", ".join(f"{x:+.4f}" for x in g["per_seed"]) + ")"
    )


def main() -> None:
    # One thread by default: on a few shared cores a second OpenMP thread mostly
    # spin-waits; the peak is measured with the same setting, so ratios stay fair.
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    config = GemConfig(max_len=256)
    print(
        f"device {DEVICE}, {torch.get_num_threads()} threads, QUICK={QUICK}, config d_model={config.d_model} "
        f"heads={config.num_heads} layers={config.num_layers} block={config.block_size}"
    )
    speedup, shape = bench_attention(config)
    slope, full_slope = bench_scaling(config)
    achieved, peak, by_width = bench_flops(config)
    metrics = bench_quality(config)
    first = f"skip_on_{SKIP_SEEDS[0]}"
    skip = metrics[first]["component_skip"]
    auc_of = {name: m["model"]["click"]["auc"] for name, m in metrics.items()}
    lost = skip_auc_cost()
    on = np.mean([auc_of[f"skip_on_{s}"] for s in SKIP_SEEDS])
    off = np.mean([auc_of[f"skip_off_{s}"] for s in SKIP_SEEDS])
    context_auc, context_gain, long = context_gains()
    result(
        "model_length_slope",
        1.15 / slope,
        1,
        f"whole-model forward slope {slope:.3f} (one user, 512->65536 tokens) vs padded full attention "
        f"layer {full_slope:.3f} (512->{4096 if QUICK else 8192})",
    )
    result(
        "model_flops_utilization",
        achieved / peak,
        0.40,
        f"d_model 256: {achieved / 1e9:.1f} GFLOP/s achieved / {peak / 1e9:.1f} GFLOP/s fp32 torch.mm peak on "
        f"{DEVICE} (d_model {config.d_model}: {by_width[config.d_model] / peak:.0%})",
    )
    result(
        "model_skip_flops_saved",
        skip["flops_saved_fraction"],
        0.40,
        f"forward FLOPs/example {skip['flops_per_example_skip_off'] / 1e6:.2f}M -> "
        f"{skip['flops_per_example_skip_on'] / 1e6:.2f}M with component skip",
    )
    holdout = metrics[first]["data"]
    # met when the interval's upper end (the most skipping may lose) is within the bound
    result(
        "model_skip_auc_cost",
        0.002 / max(lost["high"], 1e-4),
        1,
        f"click AUC skip on {on:.4f} vs off {off:.4f}: lost {_interval(lost)}; bound 0.002 on the upper end; "
        f"holdout {holdout['holdout_examples']} rows, {holdout['holdout_clicks']} clicks",
    )
    shortest, longest = CONTEXT_LENGTHS[0], CONTEXT_LENGTHS[-1]
    result(
        "model_context_length",
        context_auc[longest]["long"] / context_auc[shortest]["long"],
        1,
        f"niche-interest world (--niche-affinity {NICHE_AFFINITY:g}): click AUC on the {long['rows']} holdout "
        f"rows with > {shortest} history events ({long['clicks']} "
        f"clicks, {long['users']} users, {long['share']:.0%} of the weighted holdout), mean of "
        f"{_seeds(len(CONTEXT_SEEDS))}: "
        + ", ".join(f"max_len {n} {a['long']:.4f}" for n, a in context_auc.items())
        + "; gain over "
        + f"{shortest}: "
        + "; ".join(f"{n} {_interval(g)}" for n, g in context_gain.items())
        + "; all rows: "
        + ", ".join(f"{n} {a['all']:.4f}" for n, a in context_auc.items()),
    )
    beat = metrics[first]
    conversion = conversion_vs_baseline()
    for task in ("click", "conversion"):
        gain = beat["model_vs_baseline"][task]
        seeds = f"; over {conversion['seeds']} seeds: gain {_interval(conversion)}" if task == "conversion" else ""
        result(
            f"model_vs_baseline_{task}",
            beat["model"][task]["auc"] / beat["baseline"][task]["auc"],
            1,
            f"holdout {task} AUC model {beat['model'][task]['auc']:.4f} vs popularity+LR "
            f"{beat['baseline'][task]['auc']:.4f} (seed {SKIP_SEEDS[0]}: gain 90% interval "
            f"{gain['auc_gain_p05']:+.4f}..{gain['auc_gain_p95']:+.4f}, {beat['model'][task]['positives']} "
            f"positives){seeds}; NE {beat['model'][task]['ne']:.4f} vs {beat['baseline'][task]['ne']:.4f}",
        )
    result(
        "model", speedup, 3, f"jagged block attention vs padded full attention, tokens/s ratio ({shape}) on {DEVICE}"
    )


if __name__ == "__main__":
    main()
