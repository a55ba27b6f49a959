"""The extender's per-request metrics, counted through the series it keeps looked up."""

from __future__ import annotations

from defrag.extender.server import ExtenderMetrics


def _value(metrics: ExtenderMetrics, name: str, labels: dict[str, str]) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_each_request_counts_in_its_own_series() -> None:
    metrics = ExtenderMetrics.create()
    for verb, code, seconds in [
        ("filter", 200, 0.0015),
        ("filter", 200, 0.03),
        ("prioritize", 200, 0.0005),
        ("filter", 503, 0.2),
    ]:
        metrics.observe_request(verb, code, seconds)
    metrics.observe_fresh("ahead")
    metrics.observe_fresh("ahead")
    metrics.observe_fresh("waited")
    total = "defrag_extender_requests_total"
    assert _value(metrics, total, {"verb": "filter", "code": "200"}) == 2
    assert _value(metrics, total, {"verb": "filter", "code": "503"}) == 1
    assert _value(metrics, total, {"verb": "prioritize", "code": "200"}) == 1
    count = "defrag_extender_request_seconds_count"
    assert _value(metrics, count, {"verb": "filter"}) == 3
    bucket = "defrag_extender_request_seconds_bucket"
    assert _value(metrics, bucket, {"verb": "filter", "le": "0.002"}) == 1
    assert _value(metrics, bucket, {"verb": "filter", "le": "0.05"}) == 2
    summed = _value(metrics, "defrag_extender_request_seconds_sum", {"verb": "filter"})
    assert summed is not None and abs(summed - 0.2315) < 1e-9
    fresh = "defrag_extender_fresh_answers_total"
    assert _value(metrics, fresh, {"how": "ahead"}) == 2
    assert _value(metrics, fresh, {"how": "waited"}) == 1


def test_two_registries_keep_their_own_series() -> None:
    one, two = ExtenderMetrics.create(), ExtenderMetrics.create()
    one.observe_request("filter", 200, 0.001)
    total = "defrag_extender_requests_total"
    assert _value(one, total, {"verb": "filter", "code": "200"}) == 1
    assert _value(two, total, {"verb": "filter", "code": "200"}) is None
