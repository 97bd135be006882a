"""FAISS building blocks (pure functions over numpy arrays and faiss indexes, no Beam).

Index types come as factory strings (``"Flat"``, ``"HNSW32"``, ``"IVF4096,Flat"``,
``"IVF1024,PQ16"``; ``"auto"`` picks Flat for small inputs, IVF,Flat for medium ones and the
compressed ``IVF,PQ,RFlat`` from :data:`AUTO_COMPRESSED_FROM` users). A trailing ``,RFlat``
is a refine step, as in faiss's ``IndexRefineFlat``: the compressed index proposes
``REFINE_K_FACTOR`` x k candidates and they are re-ranked exactly on the stored vectors
(the index folder's float16 ``vectors.npy``, which the resolver keeps anyway), so the
refine costs no second copy of the vectors (:class:`RefinedIndex`).
IVF and flat-code indexes (Flat, PQ, SQ) built on disjoint shards from one trained
index can be merged into one; graph indexes (HNSW) cannot and are served as an
``IndexShards``. GPU: with ``gpu="auto"`` a faiss build with GPU support and a
visible GPU gets GPU copies for training, adding and searching (index types the
GPU lacks, like HNSW, stay on the CPU); otherwise everything runs on the CPU.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Literal

import numpy as np

from pipelines.errors import ConfigError
from pipelines.optional import require

# faiss runs many short OpenMP regions (k-means per PQ sub-quantizer, per iteration); with the
# default active wait, idle threads spin between them and, on cores shared with other processes,
# training slows many times over. Read once, when faiss's OpenMP runtime loads: set it before.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # which SIMD build loaded: noise per process
_faiss = require("faiss", ("cpu", "gpu"), "Similarity indexes (FAISS)")

log = logging.getLogger(__name__)

#: faiss's generated stubs miss much of its SWIG surface (IndexShards.at, ParameterSpace
#: overloads): the project treats the module as untyped, through this one name.
faiss: Any = _faiss

Metric = Literal["ip", "l2"]
GpuMode = Literal["auto", "off"]
METRICS: dict[str, int] = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}
AUTO_FLAT_BELOW = 20_000
#: From here ``auto`` compresses: IVF,Flat's float codes pass 1 GiB at 64 dims (4M x 256 bytes).
AUTO_COMPRESSED_FROM = 4_000_000
REFINE = ",RFlat"
REFINE_K_FACTOR = 8
ADD_BATCH = 65_536
_TRAIN_POINTS_PER_LIST = 40
_MIN_TRAIN = 65_536

__all__ = [
    "RefinedIndex",
    "SearchWrapper",
    "base_factory",
    "exact_search",
    "faiss",
    "faiss_gpu_mode",
    "gpu_count",
    "merge_indexes",
    "mergeable",
    "new_index",
    "recall_at_k",
    "resolve_factory",
    "searchable",
    "set_search_params",
    "to_cpu",
    "to_gpu",
    "train_size",
    "tune_search",
]


def resolve_factory(factory: str, n: int, dim: int = 64) -> str:
    """``auto`` -> ``Flat`` below 20,000 vectors, ``IVF<nlist>,Flat`` with nlist ≈ 4·√n (a power of 2)
    below :data:`AUTO_COMPRESSED_FROM`, else ``IVF<nlist>,PQ<dim/2>,RFlat`` (2 dims per byte, refined)."""
    if factory != "auto":
        return factory
    if n < AUTO_FLAT_BELOW:
        return "Flat"
    nlist = 2 ** round(math.log2(4 * math.sqrt(n)))
    if n < AUTO_COMPRESSED_FROM:
        return f"IVF{nlist},Flat"
    return f"IVF{nlist},PQ{dim // 2 if dim % 2 == 0 else dim}{REFINE}"


def base_factory(factory: str) -> tuple[str, bool]:
    """``(the factory faiss builds, whether a refine step re-ranks on the stored vectors)``."""
    if factory.endswith(REFINE):
        return factory[: -len(REFINE)], True
    return factory, False


def new_index(factory: str, dim: int, metric: Metric) -> Any:
    """An empty index from a factory string; :class:`ConfigError` naming ``--factory`` when unparsable."""
    if metric not in METRICS:
        raise ConfigError("--metric", f"unknown metric {metric!r}", "pass ip or l2")
    base, refine = base_factory(factory)
    try:
        if refine and not base:
            raise RuntimeError("a refine step needs a base index")
        index = faiss.index_factory(dim, base, METRICS[metric])
    except RuntimeError as exc:
        raise ConfigError(
            "--factory",
            f"faiss cannot build {factory!r} for dim {dim}",
            "pass a faiss factory string such as Flat, HNSW32, IVF1024,Flat, IVF1024,PQ16 or IVF1024,PQ32,RFlat",
        ) from exc
    for owner in (index, faiss.extract_index_ivf(index) if nlist_of(index) is not None else None):
        if owner is not None and hasattr(owner, "do_polysemous_training"):
            # polysemous training (a simulated annealing over code order, for Hamming pre-filtering,
            # which no search here uses) is most of a PQ index's training time
            owner.do_polysemous_training = False
    return index


def nlist_of(index: Any) -> int | None:
    """The number of inverted lists of an IVF index (inside any pre-transform), else None."""
    try:
        return int(faiss.extract_index_ivf(index).nlist)
    except RuntimeError:
        return None


def train_size(index: Any, n: int, requested: int | None = None) -> int:
    """How many vectors to train on: 0 for indexes that need no training, else ``requested``
    or enough for the index (40 per IVF list, at least 65,536), never more than ``n``."""
    if index.is_trained:
        return 0
    if requested is not None:
        return min(n, requested)
    nlist = nlist_of(index) or 0
    return min(n, max(_TRAIN_POINTS_PER_LIST * nlist, _MIN_TRAIN))


def seed_training(index: Any, seed: int) -> None:
    """Seed the k-means of an IVF coarse quantizer and of a product quantizer, so builds repeat."""
    ivf = faiss.extract_index_ivf(index) if nlist_of(index) is not None else None
    if ivf is not None:
        ivf.cp.seed = seed
    for owner in (ivf, index):
        pq = getattr(owner, "pq", None) if owner is not None else None
        if pq is not None:
            pq.cp.seed = seed


def check_trainable(index: Any, factory: str, n_train: int) -> None:
    """Fail early when an index cannot be trained on ``n_train`` vectors (IVF needs ≥ nlist)."""
    if index.is_trained:
        return
    nlist = nlist_of(index)
    need = nlist if nlist is not None else 256
    if n_train < need:
        raise ConfigError(
            "--factory",
            f"{factory!r} needs at least {need} training vectors, the input has {n_train}",
            "pass a smaller index (e.g. Flat or fewer IVF lists)",
        )


def gpu_count(mode: GpuMode) -> int:
    """GPUs faiss may use: 0 with ``off``, without GPU support in this faiss build, or without GPUs."""
    if mode == "off" or not hasattr(faiss, "StandardGpuResources"):
        return 0
    return int(faiss.get_num_gpus())


def faiss_gpu_mode(device: str) -> GpuMode:
    """The GPU mode for a ``--device {auto,cpu,cuda}`` flag; ``cuda`` needs a GPU faiss can use."""
    if device == "cpu":
        return "off"
    if device == "cuda" and gpu_count("auto") == 0:
        raise ConfigError(
            "--device",
            "cuda was asked for but faiss sees no GPU (faiss-cpu installed, or no GPU visible)",
            "install the gpu extra on a GPU machine, or pass --device auto or cpu",
        )
    if device not in ("auto", "cuda"):
        raise ConfigError("--device", f"unknown device {device!r}", "pass auto, cpu or cuda")
    return "auto"


def to_gpu(index: Any, mode: GpuMode) -> tuple[Any, bool]:
    """``(index on all GPUs, True)`` when allowed and supported, else ``(index, False)``."""
    if gpu_count(mode) == 0:
        return index, False
    try:
        return faiss.index_cpu_to_all_gpus(index), True
    except (RuntimeError, AttributeError) as exc:  # e.g. HNSW has no GPU implementation
        log.info("faiss: %s stays on the CPU (%s)", type(index).__name__, str(exc).splitlines()[0][:120])
        return index, False


def to_cpu(index: Any, on_gpu: bool) -> Any:
    return faiss.index_gpu_to_cpu(index) if on_gpu else index


def train(index: Any, sample: np.ndarray, gpu: GpuMode = "off") -> Any:
    """Train ``index`` on ``sample`` (N, D) float32 (on GPU when allowed); returns the trained CPU index."""
    if index.is_trained:
        return index
    work, on_gpu = to_gpu(index, gpu)
    work.train(sample)
    return to_cpu(work, on_gpu)


def add_in_batches(
    index: Any, vectors: np.ndarray, ids: np.ndarray | None = None, gpu: GpuMode = "off", batch: int = ADD_BATCH
) -> Any:
    """Add ``vectors`` (with explicit ``ids`` when given) ``batch`` rows at a time; returns the CPU index."""
    work, on_gpu = to_gpu(index, gpu)
    for start in range(0, len(vectors), batch):
        chunk = np.ascontiguousarray(vectors[start : start + batch])
        if ids is None:
            work.add(chunk)
        else:
            work.add_with_ids(chunk, np.ascontiguousarray(ids[start : start + batch], dtype=np.int64))
    return to_cpu(work, on_gpu)


def uses_explicit_ids(index: Any) -> bool:
    """IVF indexes take explicit ids (global positions); flat-code and graph indexes number rows in order."""
    return nlist_of(index) is not None


def mergeable(index: Any) -> bool:
    """Whether shards of this index type merge into one index (IVF and flat-code indexes)."""
    return nlist_of(index) is not None or isinstance(index, faiss.IndexFlatCodes)


def merge_indexes(parts: list[Any]) -> Any:
    """Merge shard indexes (same trained state, disjoint ids, in position order) into the first."""
    base = parts[0]
    for other in parts[1:]:
        if nlist_of(base) is not None:
            inner = faiss.extract_index_ivf(base)
            inner.merge_from(faiss.extract_index_ivf(other), 0)
            if inner is not base:  # a pre-transform wrapper keeps its own count
                base.ntotal = inner.ntotal
        else:
            base.merge_from(other)
    return base


def serialize(index: Any) -> bytes:
    return bytes(faiss.serialize_index(index))


def deserialize(data: bytes) -> Any:
    return faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))


def set_search_params(index: Any, params: str) -> None:
    """Apply ``"nprobe=8"`` / ``"efSearch=128"`` style parameters (also to each shard of an IndexShards)."""
    if not params:
        return
    if isinstance(index, SearchWrapper):
        index.set_search_params(params)
        return
    if isinstance(index, faiss.IndexShards):
        for i in range(index.count()):
            set_search_params(faiss.downcast_index(index.at(i)), params)
        return
    space = faiss.GpuParameterSpace() if hasattr(faiss, "GpuParameterSpace") else faiss.ParameterSpace()
    try:
        space.set_index_parameters(index, params)
    except RuntimeError as exc:
        raise ConfigError(
            "--search-params",
            f"{params!r} does not apply to {type(index).__name__}",
            "use nprobe=N for IVF indexes, efSearch=N for HNSW, or nothing",
        ) from exc


def exact_search(vectors: np.ndarray, queries: np.ndarray, k: int, metric: Metric) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force ``(scores, positions)`` of the ``k`` nearest ``vectors`` to each query: faiss's
    ``knn``, what ``IndexFlat`` searches with, without an index's own copy of ``vectors``."""
    kind = faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2
    xb, xq = np.ascontiguousarray(vectors, np.float32), np.ascontiguousarray(queries, np.float32)
    scores, ids = faiss.knn(xq, xb, k, metric=kind)
    return scores, ids


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean |found ∩ truth| / k over queries (``found``, ``truth``: (Q, k) positions, -1 = none)."""
    if truth.size == 0:
        return float("nan")
    hits = sum(
        len(np.intersect1d(f[f >= 0], t[t >= 0], assume_unique=False)) for f, t in zip(found, truth, strict=True)
    )
    return hits / truth.size


def _candidates(index: Any) -> tuple[str, list[int]] | None:
    if isinstance(index, SearchWrapper):
        return _candidates(index.inner)
    first = faiss.downcast_index(index.at(0)) if isinstance(index, faiss.IndexShards) else index
    nlist = nlist_of(first)
    if nlist is not None:
        return "nprobe", [p for p in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if p <= nlist]
    if hasattr(first, "hnsw"):
        return "efSearch", [16, 32, 64, 128, 256, 512, 1024]
    return None


def without_self(positions: np.ndarray, own: np.ndarray, k: int) -> np.ndarray:
    """``(Q, k)`` of ``positions (Q, k+1)`` with each query's own position ``own (Q,)`` dropped."""
    keep = positions != own[:, None]
    order = np.argsort(~keep, axis=1, kind="stable")[:, :k]
    return np.where(np.take_along_axis(keep, order, axis=1), np.take_along_axis(positions, order, axis=1), -1)


def tune_search(
    index: Any, queries: np.ndarray, truth: np.ndarray, target: float, own: np.ndarray | None = None
) -> tuple[str, float]:
    """The cheapest search parameter reaching ``target`` recall@k on ``queries`` against ``truth``
    (Q, k) exact positions, and the recall it gets; ``("", recall)`` for indexes with no knob.
    With ``own (Q,)`` the queries are indexed vectors whose own position is left out of the answers
    (``truth`` must already leave it out), as the resolver searches."""
    k = truth.shape[1]

    def recall() -> float:
        found = index.search(queries, k + (own is not None))[1]
        return recall_at_k(found if own is None else without_self(found, own, k), truth)

    knob = _candidates(index)
    if knob is None:
        return "", recall()
    name, values = knob
    params, got = "", float("nan")
    for value in values:
        params = f"{name}={value}"
        set_search_params(index, params)
        got = recall()
        if got >= target:
            break
    return params, got


class SearchWrapper:
    """A searcher around a faiss index (``inner``, whose type decides the search knob) that searches
    like one: ``search(queries (Q, D), k) -> (scores, positions)``; parameters go to ``inner``."""

    inner: Any

    def set_search_params(self, params: str) -> None:
        set_search_params(self.inner, params)


class RefinedIndex(SearchWrapper):
    """A compressed ``base`` index whose ``k_factor`` x k candidates are re-ranked exactly on
    ``vectors (N, D)`` (float16 or float32, memory-mapped is fine: only candidate rows are read).
    Searches like a faiss index: ``search(queries (Q, D), k) -> (scores, positions) (Q, k)``."""

    def __init__(self, base: Any, vectors: np.ndarray, metric: Metric, k_factor: int = REFINE_K_FACTOR) -> None:
        self.base, self.vectors, self.metric, self.k_factor = base, vectors, metric, k_factor

    @property
    def inner(self) -> Any:
        return self.base

    @property
    def ntotal(self) -> int:
        return int(self.base.ntotal)

    @property
    def d(self) -> int:
        return int(self.base.d)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        wide = min(max(k, k * self.k_factor), max(self.ntotal, 1))
        positions = self.base.search(queries, wide)[1]
        valid = positions >= 0
        rows = np.asarray(self.vectors[np.where(valid, positions, 0).ravel()], np.float32)
        rows = rows.reshape(len(queries), wide, -1)
        if self.metric == "ip":
            scores = np.einsum("qd,qkd->qk", queries, rows)
            scores = np.where(valid, scores, -np.inf)
            order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        else:
            scores = ((rows - queries[:, None, :]) ** 2).sum(axis=2)
            scores = np.where(valid, scores, np.inf)
            order = np.argsort(scores, axis=1, kind="stable")[:, :k]
        top = np.take_along_axis(scores, order, axis=1).astype(np.float32)
        found = np.take_along_axis(positions, order, axis=1)
        kept = np.isfinite(top)
        out_scores = np.full((len(queries), k), np.nan, np.float32)
        out_pos = np.full((len(queries), k), -1, np.int64)
        out_scores[:, : top.shape[1]] = np.where(kept, top, np.nan)
        out_pos[:, : found.shape[1]] = np.where(kept, found, -1)
        return out_scores, out_pos


def searchable(index: Any, factory: str, vectors: np.ndarray, metric: Metric) -> Any:
    """``index`` as it is searched: wrapped in a :class:`RefinedIndex` over ``vectors`` when
    ``factory`` ends in ``,RFlat``."""
    return RefinedIndex(index, vectors, metric) if base_factory(factory)[1] else index
