"""A missing optional dependency names the extra that installs it (pipelines.optional)."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import pipelines.io
import pipelines.similarity
import pipelines.store
from pipelines.errors import PipelinesError
from pipelines.inspect.plot import save_plot
from pipelines.optional import MissingExtraError, require, require_on_use


def _block(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``import module`` fail as when it is not installed (None in sys.modules)."""
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def _fresh_import(monkeypatch: pytest.MonkeyPatch, name: str, parent: types.ModuleType) -> types.ModuleType:
    """Import ``name`` anew; the test's end puts the original module (and parent attribute) back."""
    child = name.rpartition(".")[2]
    monkeypatch.delitem(sys.modules, name, raising=False)
    if hasattr(parent, child):
        monkeypatch.setattr(parent, child, getattr(parent, child))
    return importlib.import_module(name)


def test_require_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _block(monkeypatch, "redis")
    with pytest.raises(MissingExtraError) as raised:
        require("redis", "redis", "The Redis store")
    assert str(raised.value) == (
        "The Redis store needs the Python module 'redis', which is not installed. "
        "Fix: pip install 'gem-pipelines[redis]'"
    )
    assert isinstance(raised.value, PipelinesError) and isinstance(raised.value, ImportError)
    assert raised.value.name == "redis" and raised.value.extras == ("redis",)
    assert isinstance(raised.value.__cause__, ModuleNotFoundError)


def test_require_lists_alternative_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    _block(monkeypatch, "faiss")
    with pytest.raises(
        MissingExtraError, match=r"pip install 'gem-pipelines\[cpu\]' or pip install 'gem-pipelines\[gpu\]'"
    ):
        require("faiss", ("cpu", "gpu"), "Similarity indexes")


def test_require_returns_an_installed_module() -> None:
    assert require("json", "none", "a test") is sys.modules["json"]
    assert require_on_use("json", "none", "a test") is sys.modules["json"]


def test_a_broken_install_is_not_reported_as_a_missing_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gem_opt_broken.py").write_text("import gem_opt_absent_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as raised:
        require("gem_opt_broken", "plot", "a test")
    assert raised.type is ModuleNotFoundError and raised.value.name == "gem_opt_absent_dependency"


def test_require_on_use_fails_at_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    _block(monkeypatch, "redis")
    stand_in = require_on_use("redis", "redis", "The Redis store")
    assert not hasattr(stand_in, "__path__")  # protocol probes still see a plain module
    with pytest.raises(MissingExtraError, match=r"pip install 'gem-pipelines\[redis\]'"):
        stand_in.Redis  # noqa: B018


def test_store_without_redis_keeps_lmdb_and_names_the_extra_for_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    _block(monkeypatch, "redis")
    module = _fresh_import(monkeypatch, "pipelines.store.redis_store", pipelines.store)
    with pytest.raises(MissingExtraError, match=r"The Redis store .*pip install 'gem-pipelines\[redis\]'"):
        module.RedisStore(module.RedisConfig())


def test_kafka_connector_without_kafka_python(monkeypatch: pytest.MonkeyPatch) -> None:
    _block(monkeypatch, "kafka")
    with pytest.raises(MissingExtraError, match=r"Kafka connector .*pip install 'gem-pipelines\[kafka\]'"):
        _fresh_import(monkeypatch, "pipelines.io.kafka", pipelines.io)


def test_faiss_ops_without_faiss(monkeypatch: pytest.MonkeyPatch) -> None:
    _block(monkeypatch, "faiss")
    with pytest.raises(MissingExtraError, match=r"gem-pipelines\[cpu\]' or pip install 'gem-pipelines\[gpu\]'"):
        _fresh_import(monkeypatch, "pipelines.similarity.faiss_ops", pipelines.similarity)


def test_plot_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _block(monkeypatch, "matplotlib", "matplotlib.pyplot")
    with pytest.raises(MissingExtraError, match=r"inspect --plot .*pip install 'gem-pipelines\[plot\]'"):
        save_plot(str(tmp_path / "p.png"), np.array([1, 2]), {})
