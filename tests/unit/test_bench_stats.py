from gptoss_spark.bench.stats import describe, max_concurrency, percentile


def test_percentile_interpolates_like_numpy():
    xs = [10.0, 20.0, 30.0, 40.0]
    assert percentile(xs, 50) == 25.0
    assert percentile(xs, 90) == 37.0
    assert percentile(xs, 0) == 10.0 and percentile(xs, 100) == 40.0
    assert percentile([], 50) is None


def test_describe_ignores_missing_values():
    d = describe([3.0, None, 1.0, 2.0])
    assert d["n"] == 3 and d["median"] == 2.0 and d["mean"] == 2.0 and d["min"] == 1.0 and d["max"] == 3.0
    assert describe([])["median"] is None


def test_max_concurrency():
    assert max_concurrency([(0, 1), (2, 3)]) == 1  # one after another
    assert max_concurrency([(0, 5), (1, 6), (2, 7)]) == 3
    assert max_concurrency([(0, 1), (1, 2)]) == 1  # touching ends do not overlap
