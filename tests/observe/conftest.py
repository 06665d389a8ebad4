import pytest

import ms_dynvm
from ms_dynvm.observe import alarm, events, log, series


@pytest.fixture(autouse=True)
def fresh_observe(monkeypatch):
    """Each test starts with empty series, no event recording and an unfired alarm."""
    monkeypatch.delenv("DYNVM_REPORT", raising=False)
    monkeypatch.delenv("DYNVM_COMPILE_LOG", raising=False)
    ms_dynvm.reset_stats()
    series.clear()
    events.clear()
    alarm.reset()
    log.forget()
    yield
    for src in list(events._SOURCES):
        events.stop(src)
    events.clear()
    alarm.reset()
    ms_dynvm.reset_stats()
