"""The inspect tests share the precompute tests' generated world (for a representations snapshot)."""

from __future__ import annotations

from tests.precompute.conftest import world  # noqa: F401 - a fixture, used by name
