"""Similar-user fallback: a FAISS index of user representations and the Solaris resolver.

    python -m pipelines index --representations PRECOMPUTE_OUT --output INDEX_DIR
    python -m pipelines lookup --store lmdb:///path --index INDEX_DIR --user 42 --ads 7,8,9

Python API (names load lazily, so ``python -m pipelines --help`` does not import faiss)::

    from pipelines.similarity import Resolver, ResolverConfig, UserIndex
    resolver = Resolver(store, UserIndex.load(INDEX_DIR), ResolverConfig(k=10))
    got = resolver.resolve(user_id, ad_ids)      # paths, embeddings, ages
"""

from __future__ import annotations

from pipelines.lazy import lazy_exports

_EXPORTS = {
    "BuildSpec": "pipelines.similarity.build",
    "BuiltIndex": "pipelines.similarity.build",
    "build_index": "pipelines.similarity.build",
    "write_built": "pipelines.similarity.build",
    "IndexManifest": "pipelines.similarity.artifact",
    "read_manifest": "pipelines.similarity.artifact",
    "UserIndex": "pipelines.similarity.user_index",
    "Neighbors": "pipelines.similarity.user_index",
    "UserVectors": "pipelines.similarity.vectors",
    "user_vectors": "pipelines.similarity.vectors",
    "FallbackPath": "pipelines.similarity.policy",
    "PATHS": "pipelines.similarity.policy",
    "ResolverConfig": "pipelines.similarity.policy",
    "Answer": "pipelines.similarity.resolver",
    "DimensionMismatchError": "pipelines.similarity.resolver",
    "Resolution": "pipelines.similarity.resolver",
    "Resolver": "pipelines.similarity.resolver",
    "VersionMismatchError": "pipelines.similarity.resolver",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
