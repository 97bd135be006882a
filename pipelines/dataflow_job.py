"""Dataflow job graphs built offline: ``--runner DataflowRunner --dry_run=True``.

Beam's Dataflow runner with ``--dry_run=True`` translates the pipeline into the job it would
submit (name, type, the Runner API graph with its SDK container image) and returns at once,
with no network and no credentials. A batch command then writes that job to
``OUTPUT/dataflow_job/`` (``job.json``: name, type, project, region, transforms, container
images and the pipeline options with secrets redacted; ``pipeline.pb``: the Runner API
pipeline as submitted) instead of reading back outputs that a dry run never writes.
"""

from __future__ import annotations

import json
from typing import Any

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, StandardOptions, TestOptions

from pipelines.errors import ConfigError
from pipelines.redact import redact_fields

__all__ = ["JOB_DIR", "dry_run_report", "is_dry_run", "validate_dry_run", "write_dry_run"]

JOB_DIR = "dataflow_job"
TRUE = ("true", "1", "yes")


def _dry_run_value(options: PipelineOptions) -> object:
    return options.view_as(TestOptions).dry_run


def validate_dry_run(options: PipelineOptions) -> None:
    """``--dry_run`` takes a value Beam treats as true whatever it says: accept only a true one, and
    only with DataflowRunner (the one runner that builds a job without running it)."""
    value = _dry_run_value(options)
    if value in (None, False):
        return
    if str(value).lower() not in TRUE:
        raise ConfigError(
            "--dry_run", f"got {value!r}, which Beam reads as true", "pass --dry_run=True or leave it out"
        )
    if options.view_as(StandardOptions).runner != "DataflowRunner":
        raise ConfigError(
            "--dry_run", "only DataflowRunner builds a job without running it", "add --runner DataflowRunner"
        )


def is_dry_run(options: PipelineOptions | None) -> bool:
    if options is None or options.view_as(StandardOptions).runner != "DataflowRunner":
        return False
    return str(_dry_run_value(options)).lower() in TRUE


def _transforms(pipeline: Any) -> list[dict[str, Any]]:
    found = []
    for transform in pipeline.components.transforms.values():
        found.append(
            {
                "name": transform.unique_name,
                "urn": transform.spec.urn,
                "inputs": sorted(transform.inputs.values()),
                "outputs": sorted(transform.outputs.values()),
                "leaf": not transform.subtransforms,
            }
        )
    return sorted(found, key=lambda t: t["name"])


def _images(pipeline: Any) -> list[str]:
    from apache_beam.portability.api import beam_runner_api_pb2

    images = set()
    for env in pipeline.components.environments.values():
        if env.urn == "beam:env:docker:v1":
            images.add(beam_runner_api_pb2.DockerPayload.FromString(env.payload).container_image)
    return sorted(images)


def describe(result: Any, options: PipelineOptions) -> dict[str, Any]:
    """What a dry run's ``result.job`` holds, as plain JSON-ready data."""
    job = result.job
    gcp = options.view_as(GoogleCloudOptions)
    kind = job.proto.type_
    return {
        "name": job.proto.name,
        "type": getattr(kind, "name", str(kind)),
        "project": gcp.project,
        "region": gcp.region,
        "sdk_container_images": _images(job.proto_pipeline),
        "transforms": _transforms(job.proto_pipeline),
        "options": redact_fields(options.get_all_options(drop_default=True, retain_unknown_options=True)),
    }


def write_dry_run(result: Any, options: PipelineOptions, output: str) -> dict[str, Any]:
    """Write the job to ``output/dataflow_job/`` and return the command's summary of it."""
    job = describe(result, options)
    folder = f"{output.rstrip('/')}/{JOB_DIR}"
    if not FileSystems.exists(folder):
        FileSystems.mkdirs(folder)
    with FileSystems.create(f"{folder}/job.json") as f:
        f.write(json.dumps(job, indent=2, sort_keys=True, default=str).encode())
    with FileSystems.create(f"{folder}/pipeline.pb") as f:
        f.write(result.job.proto_pipeline.SerializeToString())
    leaves = sum(1 for t in job["transforms"] if t["leaf"])
    return {
        "dry_run": True,
        "dataflow_job": folder,
        "job_name": job["name"],
        "job_type": job["type"],
        "transforms": leaves,
        "sdk_container_images": job["sdk_container_images"],
    }


def dry_run_report(summary: dict[str, Any]) -> str:
    return (
        f"dataflow dry run: job {summary['job_name']!r} ({summary['job_type']}, {summary['transforms']} transforms, "
        f"image {', '.join(summary['sdk_container_images']) or 'none'}) written to {summary['dataflow_job']}/; "
        "nothing was submitted"
    )
