"""GEM feature and representation pipelines on Apache Beam."""

from __future__ import annotations

__version__ = "0.1.0"
