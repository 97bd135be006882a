"""How good is each fallback? Hide exact pair representations of a generated world and measure.

Setup (all point-in-time, from a features folder and a trained model):

- *holdout pairs*: the last day's labelled impressions, one per (user, item) (its first
  impression), all clicked ones kept and the rest sampled (AUC does not depend on the
  class mix);
- their *exact* pair representations (history strictly before the impression), their
  *day-old* ones (``stale_after`` earlier), every user's user-level representation as of
  the holdout cutoff (indexed, as the index command would);
- a seeded ``hide`` share of the pairs is hidden: the store keeps only their day-old
  representation; the others are fresh; the k nearest users of each hidden pair's user
  get a fresh representation of that item (as if the precompute stage had covered it).

Then the real :class:`Resolver` answers every hidden pair, once with the normal policy
(the path mix) and once per fallback path alone, and each answer is compared with the
hidden exact representation: cosine, and the click AUC of the model's click head fed
the fallback vs the exact representation vs none (the mean pair representation), as
the share of the exact representation's AUC gain kept; a control blends k *random* users' fresh representations of
the same ad instead (the part of the gain the ad alone carries). The model's click head reads the
pair representation and the surface alone, so the exact score is the model's own; the
same-user path's user-level representation is scored by the log-probability its
interest head gives the ad's category (see ``_quality``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.model.checkpoint import load_model
from pipelines.model.gem import GemModel
from pipelines.model.inputs import HistoryIndex
from pipelines.model.reps import PairQueries, PairReps, click_logits, pair_reps, user_ad_scores, user_reps_at
from pipelines.model.train.data import load_features, split_by_time
from pipelines.similarity import faiss_ops as ops
from pipelines.similarity.build import BuildSpec, build_index, write_built
from pipelines.similarity.metrics import cosine_rows, gain_table, same_segment_share
from pipelines.similarity.policy import FALLBACKS, PATHS, FallbackPath, ResolverConfig
from pipelines.similarity.replay import replay_requests
from pipelines.similarity.resolver import Resolver
from pipelines.similarity.store_fill import StoreWriter
from pipelines.similarity.user_index import UserIndex
from pipelines.similarity.vectors import UserVectors
from pipelines.store import ManualClock, open_store

log = logging.getLogger(__name__)

__all__ = ["EvalConfig", "evaluate_fallback", "holdout_pairs", "neighbor_quality", "random_users_control"]

DAY_S = 86_400.0
FRESH_AGE_S = 60.0
USER_LEVEL_AGE_S = 6 * 3600.0


@dataclass(frozen=True)
class EvalConfig:
    """Inputs and knobs of :func:`evaluate_fallback` (``truth``: the generator's ``X.truth`` folder)."""

    features: str
    model: str
    output: str
    truth: str | None = None
    candidates: str | None = None
    hide: float = 0.5
    k: int = 10
    max_pairs: int = 6_000
    stale_after_s: float = DAY_S
    holdout_days: float = 1.0
    ads_only: bool = False
    factory: str = "auto"
    seed: int = 0
    device: str = "cpu"


@dataclass
class _World:
    q: PairQueries
    times: np.ndarray
    clicked: np.ndarray
    exact: PairReps
    stale: PairReps
    hidden: np.ndarray
    index: UserIndex
    user_vectors: UserVectors


def holdout_pairs(
    examples: pa.Table, *, holdout_days: float, max_pairs: int, ads_only: bool, seed: int
) -> tuple[pa.Table, int]:
    """First impression per (user, item) of the holdout days; all positives kept, negatives sampled."""
    split = split_by_time(examples, holdout_days)
    rows = split.holdout.filter(pc.field("is_ad")) if ads_only else split.holdout
    rows = rows.sort_by([("event_time", "ascending"), ("user_id", "ascending"), ("item_id", "ascending")])
    key = np.asarray(rows.column("user_id").to_numpy(), np.int64) * 1_000_003 + rows.column("item_id").to_numpy()
    _, first = np.unique(key, return_index=True)
    rows = rows.take(pa.array(np.sort(first)))
    clicked = np.asarray(rows.column("clicked").to_numpy(zero_copy_only=False), bool)
    rng = np.random.default_rng(seed)
    pos, neg = np.flatnonzero(clicked), np.flatnonzero(~clicked)
    pos = np.sort(rng.choice(pos, min(len(pos), max_pairs // 2), replace=False))
    neg = np.sort(rng.choice(neg, min(len(neg), max_pairs - len(pos)), replace=False))
    return rows.take(pa.array(np.sort(np.concatenate([pos, neg])))), split.cutoff_ms


def _queries(rows: pa.Table) -> PairQueries:
    def ints(name: str) -> np.ndarray:
        return np.asarray(pc.fill_null(rows.column(name), -1).to_numpy(zero_copy_only=False), np.int64)

    return PairQueries(ints("user_id"), ints("item_id"), ints("advertiser_id"), ints("item_category"), ints("surface"))


def _prepare(config: EvalConfig, model: GemModel, index: HistoryIndex, examples: pa.Table) -> _World:
    rows, cutoff_ms = holdout_pairs(
        examples,
        holdout_days=config.holdout_days,
        max_pairs=config.max_pairs,
        ads_only=config.ads_only,
        seed=config.seed,
    )
    q = _queries(rows)
    times = np.asarray(rows.column("event_time").cast(pa.int64()).to_numpy(), np.int64)
    exact = pair_reps(model, index, q, times)
    stale = pair_reps(model, index, q, times - int(config.stale_after_s * 1000))
    users, vectors = user_reps_at(model, index, cutoff_ms)
    user_vectors = UserVectors(
        users,
        vectors.astype(np.float16).astype(np.float32),
        np.full(len(users), cutoff_ms, np.int64),
        np.full(len(users), model.model_version, dtype=object),
    )
    built = build_index(
        user_vectors, BuildSpec(factory=config.factory, gpu=ops.faiss_gpu_mode(config.device), seed=config.seed)
    )
    write_built(built, Path(config.output) / "index")
    hidden = np.random.default_rng(config.seed + 1).random(len(q)) < config.hide
    clicked = np.asarray(rows.column("clicked").to_numpy(zero_copy_only=False), np.float64)
    log.info(
        "evaluation: %d holdout pairs (%d clicked), %d hidden, %d users indexed",
        len(q),
        int(clicked.sum()),
        int(hidden.sum()),
        len(users),
    )
    return _World(q, times, clicked, exact, stale, hidden, UserIndex.from_built(built), user_vectors)


def _neighbor_pairs(world: _World, model: GemModel, index: HistoryIndex, k: int) -> tuple[PairQueries, PairReps]:
    """Fresh (neighbour, item) representations for every hidden pair's k nearest users."""
    h = np.flatnonzero(world.hidden)
    found = world.index.neighbors(world.q.user_id[h], k).user_ids  # (H, k)
    rep, col = np.nonzero(found >= 0)
    src = h[rep]
    nq = PairQueries(
        found[rep, col], world.q.ad_id[src], world.q.advertiser_id[src], world.q.category[src], world.q.surface[src]
    )
    taken = set(zip(world.q.user_id.tolist(), world.q.ad_id.tolist(), strict=True))
    keep, seen = [], set()
    for i, key in enumerate(zip(nq.user_id.tolist(), nq.ad_id.tolist(), strict=True)):
        if key not in taken and key not in seen:
            seen.add(key)
            keep.append(i)
    rows = np.asarray(keep, np.int64)
    nq = nq.take(rows)
    return nq, pair_reps(model, index, nq, world.times[src][rows])


def random_users_control(
    world: _World, model: GemModel, index: HistoryIndex, k: int, prior: np.ndarray, seed: int
) -> dict[str, Any]:
    """What the similar-users path would keep with k *random* other users in place of the nearest
    ones (their fresh pair representations of the same ad, averaged): the share of the gain
    that comes from the ad alone, which any blend of other users' pair representations carries."""
    h = np.flatnonzero(world.hidden)
    users = world.user_vectors.user_id
    rng = np.random.default_rng(seed + 2)
    picks = users[rng.integers(0, len(users), size=(len(h), k))] if len(users) and len(h) else np.zeros((0, k), int)
    rep, col = np.nonzero(picks != world.q.user_id[h][:, None])
    src = h[rep]
    rq = PairQueries(
        picks[rep, col], world.q.ad_id[src], world.q.advertiser_id[src], world.q.category[src], world.q.surface[src]
    )
    reps = pair_reps(model, index, rq, world.times[src])
    total = np.zeros((len(h), reps.pair.shape[1]), np.float32)
    np.add.at(total, rep, reps.pair)
    count = np.bincount(rep, minlength=len(h))[:, None]
    blend = np.where(count > 0, total / np.maximum(count, 1), prior[None, :]).astype(np.float32)
    true, surface = world.exact.pair[h], world.q.surface[h]
    none = np.broadcast_to(prior, true.shape)
    return {
        "k": k,
        "count": len(h),
        "cosine_mean": float(np.nanmean(cosine_rows(blend, true))),
        "head_pair": gain_table(
            world.clicked[h],
            click_logits(model, true, surface),
            click_logits(model, blend, surface),
            click_logits(model, none, surface),
            seed=seed,
        ),
    }


def _fill(store_uri: str, world: _World, nq: PairQueries, nreps: PairReps, version: str, now_s: float) -> None:
    with open_store(store_uri) as store:
        store.clear()
        writer = StoreWriter(store, version, now_s)
        writer.users(world.user_vectors.user_id, world.user_vectors.vectors, USER_LEVEL_AGE_S)
        shown = ~world.hidden
        writer.pairs(
            world.q.user_id[shown],
            world.q.ad_id[shown],
            world.exact.pair[shown],
            world.exact.click_logit[shown],
            FRESH_AGE_S,
        )
        writer.pairs(
            world.q.user_id[world.hidden],
            world.q.ad_id[world.hidden],
            world.stale.pair[world.hidden],
            world.stale.click_logit[world.hidden],
            DAY_S,
        )
        writer.pairs(nq.user_id, nq.ad_id, nreps.pair, nreps.click_logit, FRESH_AGE_S)


def _resolve_hidden(resolver: Resolver, world: _World) -> tuple[np.ndarray, np.ndarray]:
    """Path ``(H,)`` and representation ``(H, R)`` of every hidden pair, one request per user."""
    h = np.flatnonzero(world.hidden)
    paths = np.full(len(h), FallbackPath.NONE, np.int8)
    emb = np.full((len(h), world.exact.pair.shape[1]), np.nan, np.float32)
    users = world.q.user_id[h]
    for user in np.unique(users).tolist():
        at = np.flatnonzero(users == user)
        got = resolver.resolve(user, world.q.ad_id[h[at]])
        paths[at], emb[at] = got.path, got.embedding
    return paths, emb


def _stored_user_reps(world: _World, users: np.ndarray) -> np.ndarray:
    """The user-level representation the store holds for each of ``users`` (zeros where none)."""
    pos = world.index.positions_of(users)  # the index holds world.user_vectors, one row per user
    return np.where(pos[:, None] >= 0, world.index.vectors[pos], 0.0).astype(np.float32)


def _quality(
    world: _World, model: GemModel, paths: np.ndarray, emb: np.ndarray, code: int, prior: np.ndarray, seed: int
) -> dict[str, Any]:
    """Cosine and AUC gain of the pairs answered by ``code``. Head ``pair``: the model's click head
    (which reads the pair representation and the surface alone) fed the exact pair representation,
    the fallback and none (the mean pair representation). The same-user path answers with a
    user-level representation, which is not in the pair space: head ``user`` ranks by the
    log-probability its interest head gives the ad's category (exact and none as for head ``pair``)."""
    h = np.flatnonzero(world.hidden)
    sel = paths == code
    rows = h[sel]
    out: dict[str, Any] = {"share_of_hidden": float(sel.mean()) if len(sel) else float("nan"), "count": int(sel.sum())}
    if not len(rows):
        return out
    true = world.exact.pair[rows]
    none = np.broadcast_to(prior, true.shape)
    surface, labels = world.q.surface[rows], world.clicked[rows]
    exact_scores, none_scores = click_logits(model, true, surface), click_logits(model, none, surface)
    if code == FallbackPath.SAME_USER:
        stored = _stored_user_reps(world, world.q.user_id[rows])
        out["head_user"] = gain_table(
            labels, exact_scores, user_ad_scores(model, stored, world.q.category[rows]), none_scores, seed=seed
        )
        return out
    cos = cosine_rows(emb[sel], true)
    out["cosine_mean"], out["cosine_median"] = float(np.nanmean(cos)), float(np.nanmedian(cos))
    out["cosine_none_mean"] = float(np.nanmean(cosine_rows(none, true)))
    fallback = emb[sel] if code != FallbackPath.NONE else none
    out["head_pair"] = gain_table(labels, exact_scores, click_logits(model, fallback, surface), none_scores, seed=seed)
    return out


def neighbor_quality(index: UserIndex, truth_users: pa.Table, k: int, seed: int = 0) -> dict[str, float]:
    """Share of each indexed user's k neighbours in its ground-truth segment, vs k random other users."""
    seg_of = dict(
        zip(truth_users.column("user_id").to_pylist(), truth_users.column("segment").to_pylist(), strict=True)
    )
    users = index.user_ids
    own = np.array([seg_of.get(u, -1) for u in users.tolist()], np.int64)
    found = index.neighbors(users, k).user_ids
    seg = np.vectorize(lambda u: seg_of.get(u, -1), otypes=[np.int64])(found) if found.size else found
    rng = np.random.default_rng(seed)
    random_users = users[rng.integers(0, len(users), size=found.shape)] if len(users) else found
    rseg = np.vectorize(lambda u: seg_of.get(u, -1), otypes=[np.int64])(random_users) if found.size else found
    rseg = np.where(random_users == users[:, None], -1, rseg)
    return {
        "k": k,
        "users": len(users),
        "same_segment_share": same_segment_share(seg, own),
        "random_same_segment_share": same_segment_share(rseg, own),
    }


def replay_mix(
    candidates: pa.Table, index: UserIndex, users: UserVectors, store_uri: str, *, k: int, measure_from_ms: int
) -> dict[str, Any]:
    """Path mix of the candidate stream after ``measure_from_ms`` (see :mod:`replay`), two policies:
    the default one and pairs only (no user-level answer: what a consumer of pair representations gets)."""
    clock = ManualClock(measure_from_ms / 1000.0)
    with open_store(store_uri) as store:
        store.clear()
        writer = StoreWriter(store, index.model_version, clock.now_s)
        writer.users(users.user_id, users.vectors, 0.0)
        resolvers = {
            name: Resolver(store, index, ResolverConfig(max_age_s=3600.0, k=k, paths=paths), clock=clock)
            for name, paths in (("policy", FALLBACKS), ("pairs_only", ("same_user_pair", "similar_users")))
        }
        zeros = np.zeros((1, index.dim), np.float32)
        results = replay_requests(
            candidates,
            resolvers,
            writer,
            clock,
            lambda user, ads: np.repeat(zeros, len(ads), axis=0),
            measure_from_ms=measure_from_ms,
        )
    return {
        name: {
            "requests": r.requests,
            "candidates": r.candidates,
            "mix": r.mix,
            "shares": r.shares(),
            "latency_ms_p50": float(np.percentile(r.latency_ms, 50)) if r.latency_ms else None,
            "latency_ms_p99": float(np.percentile(r.latency_ms, 99)) if r.latency_ms else None,
        }
        for name, r in results.items()
    }


def category_profiles(index: HistoryIndex, as_of_ms: int) -> UserVectors:
    """A behavioural yardstick for the learned user representations: each user's share of events per
    item category before ``as_of_ms``, L2-normalised (users with no such event left out)."""
    rows = np.repeat(np.arange(len(index.user_ids)), np.diff(index.offsets))
    keep = (index.event_time < as_of_ms) & (index.columns["category"] >= 0)
    width = int(index.columns["category"].max(initial=0)) + 1
    counts = np.zeros((len(index.user_ids), width), np.float32)
    np.add.at(counts, (rows[keep], index.columns["category"][keep]), 1.0)
    norm = np.linalg.norm(counts, axis=1)
    has = norm > 0
    n = int(has.sum())
    return UserVectors(
        index.user_ids[has], counts[has] / norm[has, None], np.zeros(n, np.int64), np.full(n, "", dtype=object)
    )


def evaluate_fallback(config: EvalConfig, *, model: GemModel | None = None) -> dict[str, Any]:
    """Run the evaluation described in the module docstring; returns the report (also the caller's to save)."""
    started = time.perf_counter()
    out = Path(config.output)
    out.mkdir(parents=True, exist_ok=True)
    model = model or load_model(config.model, device=config.device)
    histories, examples = load_features(config.features, "--features")
    index = HistoryIndex(histories)
    world = _prepare(config, model, index, examples)
    nq, nreps = _neighbor_pairs(world, model, index, config.k)
    now_s = float(world.times.max()) / 1000.0 + 3600.0
    store_uri = f"lmdb://{(out / 'store').resolve()}"
    _fill(store_uri, world, nq, nreps, model.model_version, now_s)
    prior = world.exact.pair[~world.hidden].mean(axis=0) if (~world.hidden).any() else world.exact.pair.mean(axis=0)
    report: dict[str, Any] = {
        "pairs": len(world.q),
        "hidden": int(world.hidden.sum()),
        "clicked": int(world.clicked.sum()),
        "neighbor_pairs_written": len(nq),
        "model_version": model.model_version,
        "config": config.__dict__,
    }
    variants = {"policy": FALLBACKS, **{name: (name,) for name in FALLBACKS}}
    with open_store(store_uri) as store:
        for name, paths in variants.items():
            resolver = Resolver(
                store, world.index, ResolverConfig(max_age_s=3600.0, k=config.k, paths=paths), clock=ManualClock(now_s)
            )
            chosen, emb = _resolve_hidden(resolver, world)
            codes = [FallbackPath[p.upper()] for p in paths] if name != "policy" else list(FallbackPath)[1:4]
            report[name] = {PATHS[c]: _quality(world, model, chosen, emb, c, prior, config.seed) for c in codes}
            report[name]["mix"] = {PATHS[c]: int((chosen == c).sum()) for c in range(len(PATHS))}
    report["random_users_control"] = random_users_control(world, model, index, config.k, prior, config.seed)
    if config.truth:
        truth = pq.read_table(str(Path(config.truth) / "users.parquet"), columns=["user_id", "segment"])
        report["neighbors"] = neighbor_quality(world.index, truth, config.k, config.seed)
        cutoff = int(world.user_vectors.computed_at_ms[0]) if len(world.user_vectors) else 0
        profiles = build_index(category_profiles(index, cutoff), BuildSpec(factory="Flat", gpu="off"), model_version="")
        report["neighbors_category_profile"] = neighbor_quality(
            UserIndex.from_built(profiles), truth, config.k, config.seed
        )
    if config.candidates:
        cutoff = int(world.user_vectors.computed_at_ms[0]) if len(world.user_vectors) else 0
        report["stream"] = replay_mix(
            pq.read_table(config.candidates),
            world.index,
            world.user_vectors,
            f"lmdb://{(out / 'replay-store').resolve()}",
            k=config.k,
            measure_from_ms=cutoff,
        )
    report["seconds"] = round(time.perf_counter() - started, 1)
    return report
