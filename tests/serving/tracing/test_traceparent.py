"""The W3C traceparent header, checked (serving/tracing/traceparent.py)."""
from __future__ import annotations

import pytest

from serving.tracing.traceparent import BadTraceparent, check

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_good_one_is_kept():
    assert check(GOOD) == GOOD
    assert check("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-future").startswith("01-")


@pytest.mark.parametrize("bad,words", [
    ("nonsense", "is not a W3C trace context"),
    ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "is not a W3C trace context"),  # upper case
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", "is not a W3C trace context"),
    ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version 'ff'"),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", "version '00'"),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", "all-zero"),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "all-zero"),
])
def test_a_malformed_one_is_refused_saying_why(bad, words):
    with pytest.raises(BadTraceparent, match=words) as raised:
        check(bad)
    assert raised.value.status == 400
