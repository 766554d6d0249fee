"""Pooling plug-ins against sentence-transformers' own ``Pooling`` and ``Normalize`` modules, on random
token vectors with right- and left-padded masks; names and aliases."""
from __future__ import annotations

import numpy as np
import pytest

from preprocess.pooling import POOLINGS, normalize, pool, pooling_name
from tests.support.ci import require_module

ST_MODES = {"mean": "mean", "cls": "cls", "max": "max", "last": "lasttoken", "mean_sqrt_len": "mean_sqrt_len_tokens",
            "weighted_mean": "weightedmean"}


def _batch(seed: int, left: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(5, 9, 16)).astype(np.float32)
    lengths = np.array([9, 1, 4, 7, 2])
    positions = np.arange(9)[None, :]
    mask = (positions >= 9 - lengths[:, None]) if left else (positions < lengths[:, None])
    return hidden, mask.astype(np.int64)


@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
@pytest.mark.parametrize("name", sorted(POOLINGS))
def test_each_pooling_is_sentence_transformers_own(name, left):
    torch = require_module("torch")
    from sentence_transformers.sentence_transformer.modules import Pooling

    hidden, mask = _batch(3, left)
    expected = Pooling(16, pooling_mode=ST_MODES[name])(
        {"token_embeddings": torch.from_numpy(hidden), "attention_mask": torch.from_numpy(mask)})["sentence_embedding"]
    got = pool(name, hidden, mask)
    assert got.dtype == np.float32 and got.shape == (5, 16)
    np.testing.assert_allclose(got, expected.numpy(), rtol=0, atol=2e-6)


def test_normalize_is_sentence_transformers_normalize():
    torch = require_module("torch")
    from sentence_transformers.base.modules import Normalize

    vectors = np.random.default_rng(1).normal(size=(4, 16)).astype(np.float32)
    vectors[2] = 0.0  # a zero row stays zero, as torch's normalize leaves it
    expected = Normalize()({"sentence_embedding": torch.from_numpy(vectors)})["sentence_embedding"].numpy()
    np.testing.assert_allclose(normalize(vectors), expected, rtol=0, atol=1e-7)


def test_names_of_sentence_transformers_and_tei_mean_the_same_pooling():
    assert pooling_name("lasttoken") == pooling_name("last-token") == "last"
    assert pooling_name("mean_sqrt_len_tokens") == "mean_sqrt_len"
    assert pooling_name(" CLS ") == "cls"
    with pytest.raises(ValueError, match="unknown pooling 'splade'; one of mean, cls, max, last"):
        pooling_name("splade")
