"""A preprocess.py that cannot be loaded says why, instead of failing on the first request."""
from __future__ import annotations

import pytest

from preprocess.user_code import UserCodeError, UserProcessor


@pytest.mark.parametrize("source, words", [
    ("class Other: pass\n", "no class named Preprocess"),
    ("def broken(:\n", "failed to import: SyntaxError"),
    ("class Preprocess:\n    def __init__(self):\n        raise RuntimeError('no GPU')\n", "no GPU"),
])
def test_unloadable_files_say_why(tmp_path, source, words):
    path = tmp_path / "preprocess.py"
    path.write_text(source)
    with pytest.raises(UserCodeError, match=words):
        UserProcessor(path)
