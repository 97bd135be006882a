"""Regenerate pipelines/schemas/event.schema.json: ``python -m pipelines.schemas``."""

from __future__ import annotations

from pathlib import Path

from pipelines.schemas.wire import render_event_json_schema

if __name__ == "__main__":
    target = Path(__file__).with_name("event.schema.json")
    target.write_text(render_event_json_schema())
    print(f"wrote {target}")
