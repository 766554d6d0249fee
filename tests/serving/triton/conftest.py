"""Fixtures for the Triton tests: a second tiny model (different weights) next to tests/conftest.py's."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_b(tmp_path_factory):
    """Same architecture as ``tiny_model``, other seed: a distinguishable "version 2"."""
    from serving.testmodels import build_bert_classifier

    return build_bert_classifier(tmp_path_factory.mktemp("tiny-bert-b"), seed=1)
