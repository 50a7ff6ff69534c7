"""The worker's request to its harness, as tests make it (env_pool/evaluate.harness_request under the default env config)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from configs.schema import EnvConfig
from env_pool.evaluate import harness_request
from env_pool.trusted.harness_request import HarnessRequest
from tasks.task import Task


def request_for(task: Task | None = None, **fields) -> HarnessRequest:
    """The request for ``task`` (a task with no model by default), with ``fields`` changed."""
    task = task or Task(id="t", level=1, source="x = 1\n")
    request = harness_request(EnvConfig(), task, "cpp", "verify", False, Path("/w/scratch/x"), Path("/w/private/x"),
                              Path("/w/inductor"), [], 0)
    return dataclasses.replace(request, **fields)
