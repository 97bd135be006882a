"""Training: point-in-time examples, multi-task loss, time-based holdout, baseline, metrics.

:func:`train_model` is the whole job behind ``python -m pipelines train``; the
smaller functions (:func:`fit`, :func:`predict`, :func:`evaluate_flops`) are reused
by the benchmark.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from pipelines.errors import ConfigError
from pipelines.model.checkpoint import resolve_device, save_checkpoint
from pipelines.model.config import GemConfig
from pipelines.model.gem import GemModel, autocast_for
from pipelines.model.inputs import ExampleSet, GemBatch, HistoryIndex
from pipelines.model.train.baseline import CountBaseline
from pipelines.model.train.data import load_features, sample_by_label, split_by_time
from pipelines.model.train.metrics import paired_auc_interval, task_metrics

log = logging.getLogger(__name__)

TASKS = ("clicked", "converted")
METRICS_NAME = "metrics.json"
#: The holdout's labels, weights, prefix lengths and both predictions (for paired comparisons across runs).
PREDICTIONS_NAME = "holdout_predictions.npz"


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and data budget of one training run."""

    epochs: int = 1
    batch_size: int = 256
    learning_rate: float = 3e-3
    weight_decay: float = 1e-5
    max_examples: int | None = 24_000
    max_holdout: int | None = 10_000
    holdout_days: float = 1.0
    conversion_weight: float = 1.0
    aux_weight: float = 0.01
    interest_weight: float = 0.5
    positive_share: float | None = 0.25
    warmup_steps: int = 50
    seed: int = 0
    data_seed: int | None = None  # seed of the training/holdout samples; None: ``seed``
    device: str = "auto"
    progress: bool = True
    compare_skip: bool = False

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "warmup_steps"):
            if getattr(self, name) < (0 if name == "warmup_steps" else 1):
                raise ValueError(f"TrainConfig.{name} must be positive, got {getattr(self, name)}")
        for name in ("max_examples", "max_holdout"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1 or None, got {value}")
        # ``not x > 0`` also refuses NaN; the errors name the train command's flags
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ConfigError("--learning-rate", f"got {self.learning_rate}", "pass a positive number such as 3e-3")
        if not (self.holdout_days > 0 and math.isfinite(self.holdout_days)):
            raise ConfigError("--holdout", f"got {self.holdout_days} days", "pass a positive duration such as 1d")
        if not (self.interest_weight >= 0 and math.isfinite(self.interest_weight)):
            raise ConfigError("--interest-weight", f"got {self.interest_weight}", "pass a number >= 0")
        if self.positive_share is not None and not 0 < self.positive_share < 1:
            raise ConfigError(
                "--positive-share", f"got {self.positive_share}", "pass a share between 0 and 1, or 0 for uniform"
            )


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)


@contextmanager
def deterministic() -> Iterator[None]:
    """Deterministic kernels (warning where none exists) for the duration of a run only."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def _batches(n: int, batch_size: int, rng: np.random.Generator | None) -> list[np.ndarray]:
    order = rng.permutation(n) if rng is not None else np.arange(n)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def _loss(model: GemModel, batch: GemBatch, tc: TrainConfig, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Click + conversion log loss (rows weighted by ``weight``, the inverse of their sampling
    rate), the MoE balance loss and the user representation's interest loss."""
    assert batch.clicked is not None and batch.converted is not None, "training batches carry labels"
    out = model(batch)
    w = None if weight is None else weight / weight.mean()
    click = F.binary_cross_entropy_with_logits(out.click_logit, batch.clicked, weight=w)
    conversion = F.binary_cross_entropy_with_logits(out.conversion_logit, batch.converted, weight=w)
    loss = click + tc.conversion_weight * conversion + tc.aux_weight * out.aux_loss
    if tc.interest_weight > 0:
        loss = loss + tc.interest_weight * model.interest_loss(out.user_embedding, batch)
    return loss


def fit(
    model: GemModel,
    examples: ExampleSet,
    tc: TrainConfig,
    device: torch.device,
    desc: str = "train",
    weights: np.ndarray | None = None,
) -> list[float]:
    """Train ``model`` in place (rows weighted by ``weights (N,)`` when given); returns the
    mean loss of each epoch."""
    rng = np.random.default_rng(tc.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tc.weight_decay}, {"params": rest, "weight_decay": 0.0}], lr=tc.learning_rate
    )
    steps_per_epoch = math.ceil(len(examples) / tc.batch_size)
    total = steps_per_epoch * tc.epochs

    def schedule(step: int) -> float:  # linear warm-up, cosine decay to 10%
        if step < tc.warmup_steps:
            return (step + 1) / tc.warmup_steps
        progress = (step - tc.warmup_steps) / max(1, total - tc.warmup_steps)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    max_len = model.config.max_len
    losses: list[float] = []
    model.train()
    with tqdm(total=total, desc=desc, unit="batch", disable=not tc.progress, dynamic_ncols=True) as bar:
        for _ in range(tc.epochs):
            epoch: list[float] = []
            for rows in _batches(len(examples), tc.batch_size, rng):
                batch = examples.batch(rows, max_len=max_len).to(device)
                weight = None if weights is None else torch.as_tensor(weights[rows], dtype=torch.float32, device=device)
                with autocast_for(device):
                    loss = _loss(model, batch, tc, weight)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                epoch.append(float(loss.item()))
                bar.update(1)
                bar.set_postfix(loss=f"{np.mean(epoch[-50:]):.4f}")
            losses.append(float(np.mean(epoch)))
    model.eval()
    return losses


@torch.inference_mode()
def predict(
    model: GemModel, examples: ExampleSet, device: torch.device, batch_size: int = 512
) -> dict[str, np.ndarray]:
    """Click and conversion probabilities ``(N,)`` of every example, in order."""
    model.eval()
    out: dict[str, list[np.ndarray]] = {task: [] for task in TASKS}
    for rows in _batches(len(examples), batch_size, None):
        with autocast_for(device):
            result = model(examples.batch(rows, max_len=model.config.max_len).to(device))
        out["clicked"].append(torch.sigmoid(result.click_logit).float().cpu().numpy())
        out["converted"].append(torch.sigmoid(result.conversion_logit).float().cpu().numpy())
    return {task: np.concatenate(parts) if parts else np.zeros(0) for task, parts in out.items()}


NAMES = {"clicked": "click", "converted": "conversion"}


def score(
    examples: ExampleSet, probs: dict[str, np.ndarray], weights: np.ndarray | None = None
) -> dict[str, dict[str, float]]:
    """AUC, NE, ... of each task (rows weighted by ``weights`` when given)."""
    return {NAMES[t]: task_metrics(examples.fields[t], probs[t], weights) for t in TASKS}


def evaluate_flops(model_config: GemConfig, examples: ExampleSet, rows: int = 256) -> dict[str, float]:
    """Forward FLOPs per example with component skip on and off (same inputs, counted by
    ``torch.utils.flop_counter``), and the fraction skipping saves."""
    from torch.utils.flop_counter import FlopCounterMode

    batch = examples.batch(np.arange(min(rows, len(examples))), max_len=model_config.max_len)
    counts = {}
    for skip in (True, False):
        model = GemModel(model_config.replace(component_skip=skip)).eval()
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(batch)
        counts[skip] = counter.get_total_flops() / max(batch.num_rows, 1)
    return {
        "flops_per_example_skip_on": counts[True],
        "flops_per_example_skip_off": counts[False],
        "flops_saved_fraction": 1.0 - counts[True] / counts[False],
    }


def _skip_quality(
    model_config: GemConfig, scores: dict[str, dict[str, float]], data: _Data, tc: TrainConfig, device: torch.device
) -> dict[str, Any]:
    """Train the other setting of ``component_skip`` on the same data and seed; report the
    holdout AUC of both and what skipping loses (positive = skipping is worse)."""
    other_config = model_config.replace(component_skip=not model_config.component_skip)
    seed_everything(tc.seed)
    other = GemModel(other_config)
    other.init_output_bias(*data.base_rates())
    other = other.to(device)
    fit(
        other,
        data.train,
        tc,
        device,
        desc="train (skip " + ("on" if other_config.component_skip else "off") + ")",
        weights=data.weights,
    )
    other_scores = score(data.holdout, predict(other, data.holdout, device), data.holdout_weights)
    on, off = (scores, other_scores) if model_config.component_skip else (other_scores, scores)
    return {
        "auc_skip_on": {t: on[t]["auc"] for t in on},
        "auc_skip_off": {t: off[t]["auc"] for t in off},
        "auc_lost": {t: off[t]["auc"] - on[t]["auc"] for t in on},
    }


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


@dataclass
class _Data:
    index: HistoryIndex
    train: ExampleSet
    weights: np.ndarray  # (N,) of the training rows: the inverse of their sampling rate
    holdout: ExampleSet
    holdout_weights: np.ndarray  # (M,): the inverse of each holdout row's sampling rate
    summary: dict[str, Any]

    def base_rates(self) -> tuple[float, float]:
        """Weighted click and conversion rates of the training rows (the split's rates)."""
        click, conversion = (float(np.average(self.train.fields[t], weights=self.weights)) for t in TASKS)
        return click, conversion


def _prepare(data_dir: str | Path, tc: TrainConfig, max_len: int) -> _Data:
    histories, examples = load_features(data_dir)
    split = split_by_time(examples, tc.holdout_days)
    index = HistoryIndex(histories)
    data_seed = tc.seed if tc.data_seed is None else tc.data_seed
    train_rows, weights = sample_by_label(split.train, tc.max_examples, tc.positive_share, data_seed)
    train = ExampleSet(index, train_rows)
    # the holdout is sampled like the training rows (every positive first, negatives weighted up),
    # so its metrics estimate the whole last day's with every conversion it holds
    holdout_rows, holdout_weights = sample_by_label(split.holdout, tc.max_holdout, tc.positive_share, data_seed + 1)
    holdout = ExampleSet(index, holdout_rows)
    summary = {
        "features": str(data_dir),
        "train_examples": len(train),
        "train_available": split.train.num_rows,
        "train_clicks": int(train.fields["clicked"].sum()),
        "train_conversions": int(train.fields["converted"].sum()),
        "holdout_examples": len(holdout),
        "holdout_available": split.holdout.num_rows,
        "holdout_clicks": int(holdout.fields["clicked"].sum()),
        "holdout_conversions": int(holdout.fields["converted"].sum()),
        "holdout_cutoff_ms": split.cutoff_ms,
        "history_events": index.num_events,
        "mean_train_prefix_tokens": float(train.prefix_lengths(max_len).mean()),
        "mean_holdout_prefix_tokens": float(holdout.prefix_lengths(max_len).mean()),
    }
    log.info(
        "training on %d of %d examples, holding out %d of %d (last %g day(s))",
        len(train),
        split.train.num_rows,
        len(holdout),
        split.holdout.num_rows,
        tc.holdout_days,
    )
    return _Data(index, train, weights, holdout, holdout_weights, summary)


def _comparison(
    model: dict[str, dict[str, float]],
    baseline: dict[str, dict[str, float]],
    holdout: ExampleSet,
    probs: tuple[dict[str, np.ndarray], dict[str, np.ndarray]],
    weights: np.ndarray,
    seed: int,
) -> dict[str, Any]:
    """Per task: AUC and NE gains of the model over the baseline, the AUC gain's 90% paired
    bootstrap interval over the holdout rows, and whether the model beats the baseline."""
    out: dict[str, Any] = {}
    for task in TASKS:
        m, b = model[NAMES[task]], baseline[NAMES[task]]
        low, high = paired_auc_interval(holdout.fields[task], probs[0][task], probs[1][task], weights, seed=seed)
        out[NAMES[task]] = {
            "auc_gain": m["auc"] - b["auc"],
            "auc_gain_p05": low,
            "auc_gain_p95": high,
            "ne_gain": b["ne"] - m["ne"],
            "beats": m["auc"] > b["auc"] and m["ne"] < b["ne"],
        }
    return out


def train_model(
    data_dir: str | Path, output_dir: str | Path, model_config: GemConfig, tc: TrainConfig
) -> dict[str, Any]:
    """Train on a features folder, evaluate model and baseline on the last-day holdout,
    save ``model.pt`` and ``metrics.json`` in ``output_dir``; returns the metrics.
    Deterministic for ``tc.seed`` (same device and thread count)."""
    with deterministic():
        return _train_model(data_dir, output_dir, model_config, tc)


def _train_model(
    data_dir: str | Path, output_dir: str | Path, model_config: GemConfig, tc: TrainConfig
) -> dict[str, Any]:
    clock = {"start": time.monotonic()}
    device = resolve_device(tc.device)
    data = _prepare(data_dir, tc, model_config.max_len)
    clock["data"] = time.monotonic()
    seed_everything(tc.seed)
    model = GemModel(model_config)
    model.init_output_bias(*data.base_rates())
    model = model.to(device)
    losses = fit(model, data.train, tc, device, weights=data.weights)
    clock["fit"] = time.monotonic()
    model_probs = predict(model, data.holdout, device)
    model_scores = score(data.holdout, model_probs, data.holdout_weights)
    clock["evaluate"] = time.monotonic()
    baseline = CountBaseline(data.train, data.weights)
    baseline_probs = baseline.predict(data.holdout)
    baseline_scores = score(data.holdout, baseline_probs, data.holdout_weights)
    popularity = {t: baseline.features.popularity(data.holdout, t, train=False) for t in TASKS}
    clock["baseline"] = time.monotonic()
    out = Path(output_dir)
    checkpoint = save_checkpoint(model.cpu(), out)
    skip = {"enabled": model_config.component_skip, **evaluate_flops(model_config, data.holdout)}
    if tc.compare_skip:
        skip.update(_skip_quality(model_config, model_scores, data, tc, device))
    clock["end"] = time.monotonic()
    phases = list(clock)
    metrics = {
        "model_version": model.model_version,
        "model": model_scores,
        "baseline": {"name": "logistic regression on count features + popularity", **baseline_scores},
        "popularity": score(data.holdout, popularity, data.holdout_weights),
        "model_vs_baseline": _comparison(
            model_scores, baseline_scores, data.holdout, (model_probs, baseline_probs), data.holdout_weights, tc.seed
        ),
        "component_skip": skip,
        "data": data.summary,
        "training": {
            "epoch_losses": losses,
            "seconds": clock["end"] - clock["start"],
            "device": str(device),
            "threads": torch.get_num_threads(),
            "phase_seconds": {b: clock[b] - clock[a] for a, b in itertools.pairwise(phases)},
            **asdict(tc),
        },
        "config": model_config.to_dict(),
        "checkpoint": str(checkpoint),
    }
    (out / METRICS_NAME).write_text(json.dumps(_json_safe(metrics), indent=2) + "\n")
    save_predictions(out / PREDICTIONS_NAME, data, model_probs, baseline_probs)
    return metrics


def save_predictions(path: Path, data: _Data, model: dict[str, np.ndarray], baseline: dict[str, np.ndarray]) -> None:
    """The holdout rows as ``(M,)`` arrays: labels, sampling weights, user ids, history lengths
    (whole prefix) and the model's and baseline's probabilities per task, in holdout order."""
    f = data.holdout.fields
    arrays = {
        "weights": data.holdout_weights,
        "user_id": f["user_id"],
        "history_length": f["history_length"],
        **{t: f[t] for t in TASKS},
        **{f"model_{t}": model[t] for t in TASKS},
        **{f"baseline_{t}": baseline[t] for t in TASKS},
    }
    with path.open("wb") as out:
        np.savez_compressed(out, allow_pickle=False, **arrays)


def load_predictions(model_dir: str | Path) -> dict[str, np.ndarray]:
    """What :func:`save_predictions` wrote in ``model_dir``."""
    with np.load(Path(model_dir) / PREDICTIONS_NAME) as stored:
        return {name: stored[name] for name in stored.files}
