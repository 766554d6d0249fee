"""Feedback joined to remembered predictions (serving/statistics/ground_truth.py): labels compare as text,
values by absolute error; the oldest predictions are forgotten past the bound; the live window drops
feedback older than its span."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from serving.statistics.ground_truth import AlreadyLabelled, FeedbackError, GroundTruth, UnknownRequest


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_join_score_bound_and_window():
    clock, registry = Clock(), CollectorRegistry()
    truth = GroundTruth(registry, max_requests=3, window_s=60, clock=clock)
    truth.remember("a", "e", 1, {"label": 1})
    truth.remember("b", "e", 1, {"label": "cat"})
    truth.remember("c", "e", 2, {"value": 2.0})
    truth.remember("d", "e", 2, {"value": 5.0})  # past the bound: "a" is forgotten
    with pytest.raises(UnknownRequest):
        truth.join("e", "a", label=1)
    with pytest.raises(UnknownRequest):
        truth.join("other", "b", label="cat")  # another endpoint's request is not this one's
    assert truth.join("e", "b", label="dog").correct is False
    with pytest.raises(AlreadyLabelled):
        truth.join("e", "b", label="cat")
    with pytest.raises(FeedbackError, match="send 'value'"):
        truth.join("e", "c", label="x")
    assert truth.join("e", "c", value=3.5).abs_error == 1.5
    clock.now = 100.0  # b's and c's feedback are past the window now
    assert truth.join("e", "d", value=4.0).abs_error == 1.0
    window = {key: (n, acc, mae) for key, n, acc, mae in truth.window()}
    assert window == {("e", "1"): (0, None, None), ("e", "2"): (1, None, 1.0)}
    assert registry.get_sample_value("serving_feedback_labelled_total", {"endpoint": "e", "version": "2"}) == 2
    assert registry.get_sample_value("serving_feedback_abs_error_sum_total", {"endpoint": "e", "version": "2"}) == 2.5
