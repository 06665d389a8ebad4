"""The measured per-size-class on/off switch of compiled groups (`ms_dynvm.cost.model.SizeSwitch`).
Pure Python: no MindSpore."""

from ms_dynvm.cost.model import CostModel, GroupStats, SizeSwitch


def _calls(sw, cls, n, served_s, eager_s):
    """n calls of class `cls`: each served or run eagerly as the switch decides, timed as given."""
    decisions = []
    for _ in range(n):
        serve = sw.should_serve(cls)
        decisions.append(serve)
        sw.record(cls, served_s if serve else eager_s, serve)
    return decisions


def test_a_class_where_serving_is_slower_switches_off_and_mostly_runs_eagerly():
    sw = SizeSwitch()
    for _ in range(3):  # eager calls before the compile
        sw.record(7, 1.0, False)
    d = _calls(sw, 7, 200, served_s=1.5, eager_s=1.0)
    assert not sw.is_on(7)
    late = d[50:]
    # Off: only the periodic probes are served.
    assert sum(late) <= len(late) // SizeSwitch.PROBE_EVERY + 1


def test_a_class_where_serving_is_faster_stays_on_with_rare_probes():
    sw = SizeSwitch()
    for _ in range(3):
        sw.record(5, 1.0, False)
    d = _calls(sw, 5, 160, served_s=0.5, eager_s=1.0)
    assert sw.is_on(5)
    # Probes come in pairs (call n and n+1, n a multiple of PROBE_EVERY); only the second is measured.
    every = SizeSwitch.PROBE_EVERY
    assert [i + 1 for i, x in enumerate(d) if not x] == [k for p in range(every, 161, every)
                                                        for k in (p, p + 1) if k <= 160]
    assert len(sw.classes[5].eager) == 3 + 160 // every - 1


def test_classes_are_independent_and_a_class_switches_back_on():
    sw = SizeSwitch()
    for cls in (3, 9):
        for _ in range(3):
            sw.record(cls, 1.0, False)
    _calls(sw, 3, 128, served_s=2.0, eager_s=1.0)
    _calls(sw, 9, 128, served_s=0.5, eager_s=1.0)
    assert not sw.is_on(3) and sw.is_on(9)
    # Serving class 3 became cheap (say a warmer cache): the probes see it and switch it back on.
    _calls(sw, 3, SizeSwitch.PROBE_EVERY * SizeSwitch.WINDOW, served_s=0.2, eager_s=1.0)
    assert sw.is_on(3)


def test_a_class_without_eager_measurements_probes_sooner():
    sw = SizeSwitch()
    d = _calls(sw, 4, 16, served_s=0.5, eager_s=1.0)
    # Probe pairs back to back until the class has MIN_SAMPLES eager samples (the second call of
    # each pair is measured), then serving.
    n = 2 * SizeSwitch.MIN_SAMPLES
    assert d[:n + 1] == [True] + [False] * n
    assert all(d[n + 1:])
    assert len(sw.classes[4].eager) == SizeSwitch.MIN_SAMPLES


def test_the_first_probe_of_a_pair_is_not_measured():
    sw = SizeSwitch()
    for _ in range(3):
        sw.record(2, 1.0, False)
        sw.record(2, 1.0, True)
    sw.classes[2].n = SizeSwitch.PROBE_EVERY - 1
    assert sw.should_serve(2) is False  # first half: its sample (a cold start) is dropped
    sw.record(2, 50.0, False)
    assert sw.should_serve(2) is False  # second half: measured
    sw.record(2, 1.0, False)
    assert list(sw.classes[2].eager) == [1.0] * 4 and sw.is_on(2)
    assert sw.should_serve(2) is True


def test_a_warm_probe_is_single_and_measured():
    sw = SizeSwitch()
    for _ in range(3):
        sw.record(2, 1.0, False)
        sw.record(2, 1.0, True)
    sw.classes[2].n = SizeSwitch.PROBE_EVERY - 1
    assert sw.should_serve(2, warm=True) is False  # an eager op just ran: MindSpore is awake
    sw.record(2, 2.0, False)
    assert list(sw.classes[2].eager) == [1.0] * 3 + [2.0]
    assert sw.should_serve(2, warm=True) is True


def test_hysteresis_keeps_a_close_call_on():
    sw = SizeSwitch()
    for _ in range(3):
        sw.record(6, 1.0, False)
    _calls(sw, 6, 100, served_s=1.03, eager_s=1.0)  # within 5%
    assert sw.is_on(6)


def test_size_class_is_the_element_count_bit_length():
    assert SizeSwitch.size_class(0) == 0
    assert SizeSwitch.size_class(1) == 1
    assert SizeSwitch.size_class(64) == SizeSwitch.size_class(127) == 7
    assert SizeSwitch.size_class(128) == 8


def test_cost_model_promotes_only_past_the_threshold_when_it_pays():
    cm = CostModel(threshold=2, initial_compile_s=0.01)
    st = GroupStats(calls=1, eager_seconds=1e-3, eager_calls=1)
    assert not cm.should_compile(st, 6)
    st = GroupStats(calls=40, eager_seconds=40 * 1e-3, eager_calls=40)
    assert cm.should_compile(st, 6)
    assert not cm.should_compile(GroupStats(calls=40, eager_seconds=40e-3, eager_calls=40, failed=True), 6)
