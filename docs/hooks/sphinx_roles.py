"""Griffe extension (mkdocstrings): Sphinx roles in the project's docstrings become Markdown code.

The docstrings name objects as ``:class:`Resolver``` or ``:mod:`pipelines.similarity.policy```;
Markdown has no roles, so each becomes a code span of the name (``~`` prefixes dropped).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?[a-z]+:`~?([^`]+)`")


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(r"`\1`", obj.docstring.value)
