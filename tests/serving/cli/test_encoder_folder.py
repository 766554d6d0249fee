"""`serving model add`'s encoder options: what a sentence-transformers folder given as --tokenizer says,
the flags over it, and the combinations refused before anything is sent."""
from __future__ import annotations

import shutil

import pytest
import typer

from serving.cli.encoder_folder import encoder_options
from serving.testmodels import TOKENIZER_FILES, minilm_dir


@pytest.fixture
def plain_tokenizer(tmp_path):
    for name in TOKENIZER_FILES:
        shutil.copyfile(minilm_dir() / name, tmp_path / name)
    return tmp_path


def test_the_folder_says_it_all_and_flags_win():
    assert encoder_options(minilm_dir(), None, None, None, None, None) == {
        "task": "embed", "pooling": "mean", "normalize": True, "max_length": 256}
    assert encoder_options(minilm_dir(), None, "lasttoken", False, 128, 4096) == {
        "task": "embed", "pooling": "last", "normalize": False, "max_length": 128, "max_batch_tokens": 4096}


def test_a_plain_tokenizer_is_a_classifier_unless_a_flag_says_encoder(plain_tokenizer):
    assert encoder_options(plain_tokenizer, None, None, None, None, None) is None
    assert encoder_options(plain_tokenizer, None, "cls", None, None, None) == {
        "task": "embed", "pooling": "cls", "normalize": False, "max_length": 512}
    assert encoder_options(plain_tokenizer, "rerank", None, None, 256, None) == {"task": "rerank", "max_length": 256}


@pytest.mark.parametrize("task, pooling, normalize, message", [
    ("cluster", None, None, "--task must be one of embed, rerank"),
    (None, "splade", None, "unknown pooling 'splade'"),
    ("rerank", "mean", None, "--pooling and --normalize are for embedding endpoints"),
])
def test_refused(plain_tokenizer, task, pooling, normalize, message):
    with pytest.raises(typer.BadParameter, match=message):
        encoder_options(plain_tokenizer, task, pooling, normalize, None, None)
