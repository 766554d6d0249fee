"""Schemathesis over both OpenAPI documents, against real processes on real sockets: no input may get a 5xx.

The control plane is fuzzed with an admin token (every operation reachable), the worker on endpoints
of every kind (tokenizer, tensors, user code, no model). Hypothesis is derandomized, so CI replays
the same examples every run; SERVING_FUZZ_EXAMPLES raises the count for a longer local run.
"""
from __future__ import annotations

import os
import zlib

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.serving.clearml.models import EXAMPLES
from tests.serving.stack import Stack, make_stack

EXAMPLES_PER_OPERATION = int(os.environ.get("SERVING_FUZZ_EXAMPLES", "75"))  # CI: 30 min for everything
WORKER_ENDPOINTS = ("clf", "raw", "user", "tmpl", "missing")
FUZZ_SETTINGS = settings(max_examples=EXAMPLES_PER_OPERATION, derandomize=True, deadline=None, database=None,
                         suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model):
    s = make_stack(tmp_path_factory.mktemp("fuzz-stack"), workers=1)
    try:
        s.start_control_plane()
        s.start_statistics()  # feedback is joined there: without it, POST .../feedback is a 503 (retry later)
        s.start_worker(0)
        s.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path))
        s.cli("model", "add", "--endpoint", "clf", "--model", "clf", "--engine", "onnxruntime",
              "--tokenizer", str(tiny_model.tokenizer_dir), "--labels", "NEGATIVE,POSITIVE")
        s.cli("model", "add", "--endpoint", "raw", "--model", "clf", "--engine", "onnxruntime")
        s.cli("model", "add", "--endpoint", "user", "--model", "clf", "--engine", "onnxruntime",
              "--preprocess", str(EXAMPLES / "sklearn" / "preprocess.py"))
        s.cli("model", "add", "--endpoint", "tmpl", "--engine", "custom",
              "--preprocess", str(EXAMPLES / "preprocess_template" / "preprocess_template.py"))
        yield s
    finally:
        s.stop_all()


def fuzz(schema, call) -> list[str]:
    """Every operation of ``schema``, EXAMPLES_PER_OPERATION derandomized cases each (a plain loop:
    schemathesis' pytest plugin does not run under this pytest); the 5xx answers seen."""
    failures: list[str] = []
    calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()

        @FUZZ_SETTINGS
        @given(case=operation.as_strategy())
        def run(case) -> None:
            nonlocal calls
            calls += 1
            response = call(case)
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path} -> {response.status_code}: "
                                f"{response.text[:300]} (body {str(case.body)[:300]})")

        run()
    print(f"{calls} requests over {len(list(schema.get_all_operations()))} operations")
    return failures


def test_control_plane_never_answers_5xx(stack: Stack):
    schema = schemathesis.openapi.from_url(f"{stack.control_plane}/openapi.json", headers=stack.headers("admin"))
    schema = schema.exclude(path_regex="^/config/stream$")  # an endless event stream, not a request/response
    failures = fuzz(schema, lambda case: case.call(headers=stack.headers("admin"), timeout=30))
    assert not failures, "\n".join(failures[:20])


def aim(case):
    """Most worker cases go to real endpoints of every kind, not to random names."""
    params = case.path_parameters or {}
    for key in ("endpoint", "name"):
        if key in params:
            params[key] = WORKER_ENDPOINTS[zlib.crc32(repr(case.body).encode()) % len(WORKER_ENDPOINTS)]
    return case


def test_worker_never_answers_5xx(stack: Stack):
    schema = schemathesis.openapi.from_url(f"{stack.worker_url()}/openapi.json")
    failures = fuzz(schema, lambda case: aim(case).call(timeout=30))
    assert not failures, "\n".join(failures[:20])
