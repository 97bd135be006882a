"""The monitoring tests run `solaris` on the precompute tests' generated world."""

from __future__ import annotations

from tests.precompute.conftest import world  # noqa: F401 - a fixture, used by name
