"""Cost model v1: promotion when the predicted saving over the expected future calls pays for the
compile; a background compile is charged BACKGROUND_SHARE of its time."""

from ms_dynvm.cost.model import BACKGROUND_SHARE, CostModel, GroupStats


def _stats(calls: int, per_call_s: float) -> GroupStats:
    return GroupStats(calls=calls, eager_calls=calls, eager_seconds=calls * per_call_s)


def test_promotion_needs_the_threshold_and_a_saving_that_pays_for_the_compile():
    cm = CostModel(threshold=2)
    assert not cm.should_compile(_stats(1, 1.0), 4)  # below the threshold
    assert not cm.should_compile(_stats(5, 1.0), 1)  # one op: nothing to fuse
    # 3 ops of 100 us: saving 300 - (100 + 3 * 8) = 176 us per call; 0.3 s needs ~1705 calls.
    assert not cm.should_compile(_stats(1000, 300e-6), 3)
    assert cm.should_compile(_stats(2000, 300e-6), 3)


def test_a_background_compile_is_charged_a_share_of_its_time():
    cm = CostModel(threshold=2)
    calls = int(0.3 * BACKGROUND_SHARE / 176e-6) + 20
    assert not cm.should_compile(_stats(calls, 300e-6), 3)
    assert cm.should_compile(_stats(calls, 300e-6), 3, background=True)
    failed = _stats(10**6, 300e-6)
    failed.failed = True
    assert not cm.should_compile(failed, 3, background=True)
