"""`ms_dynvm.report(path)` after a real training loop: the JSON's content, and the HTML loaded in
headless Chromium (no console errors; a screenshot is saved and its path printed)."""

import json
import math
import os
import tempfile

import pytest

pytest.importorskip("mindspore")
pytest.importorskip("matplotlib")

import ms_dynvm  # noqa: E402
from tests.observe import chromium  # noqa: E402
from tests.observe.train import train  # noqa: E402


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from ms_dynvm.observe import series

    series.clear()
    ms_dynvm.reset_stats()
    from ms_dynvm.frontend.dispatch import forget_compiled

    forget_compiled()  # (tier 1's executors outlive a test: start from nothing learned)
    with ms_dynvm.enabled(step_switch=True, compile_policy="threshold"):
        losses = train(steps=18)
    out = tmp_path_factory.mktemp("report") / "report.html"
    paths = ms_dynvm.report(str(out))
    return losses, paths, json.loads(open(paths["json"]).read())


def test_report_json(report):
    losses, paths, data = report
    assert len(losses) == 18 and all(math.isfinite(x) for x in losses)  # a real loop: finite losses
    assert paths["html"].endswith("report.html") and paths["json"].endswith("report.json")
    assert data["errors"] == []
    st = data["stats"]
    assert st["ops_seen"] > 100
    # steps: the step switch timed steps both ways for the one size class of this loop
    stepped = {p["key"] for p in data["steps"]["series"]}
    keys = [k for k in data["steps"]["by_key"] if k["key"] in stepped]
    assert len(keys) == 1
    k = keys[0]
    assert k["steps_ms_dynvm"] >= 3 and k["steps_eager"] >= 3, k
    assert k["median_ms_dynvm_s"] > 0 and k["median_eager_s"] > 0
    assert k["chosen"] in ("ms_dynvm", "eager")
    assert len(data["steps"]["series"]) == k["steps_ms_dynvm"] + k["steps_eager"]
    assert st["step_calls"]["vm"] >= k["steps_ms_dynvm"]
    # compiles: every tier-1 install has a log entry with its group, signature and IR
    assert st["groups_compiled"] >= 1
    comps = data["compiles"]
    assert len(comps) >= st["cache_misses"] >= 1
    assert all(c["outcome"] in ("built", "disk", "memory") and c["ir"].startswith("func @") for c in comps)
    assert all(c["signature"] and c["group"] for c in comps)
    # counters over time: monotone cumulative counts, the last sample matching stats()
    samples = data["samples"]
    assert len(samples) >= 2
    hits = [s["cache_hits"] for s in samples]
    assert hits == sorted(hits) and hits[-1] == st["cache_hits"]
    assert samples[-1]["compiles"] == st["compiles"]
    # fused groups: measured per size class; at least one was served
    groups = data["groups"]
    assert groups and any(g["served"] > 0 for g in groups)
    assert all(g["ops"] and g["n_ops"] == len(g["ops"]) for g in groups)
    # fallback table rows add up to the counters
    fb = data["fallbacks"]
    assert sum(r["count"] for r in fb if r["op"].startswith("fused group (tier1)") and "guard" not in r["reason"]) \
        == sum(st["fallbacks"].values())
    assert all(r["share"] is None or 0 <= r["share"] <= 1 for r in fb)
    # memory pool: fused results live in the pool
    assert data["pool"]["reserved_bytes"] >= data["pool"]["live_bytes"] >= 0
    assert any("pool_reserved_bytes" in s for s in samples)


def test_report_html_is_self_contained(report):
    _, paths, _ = report
    with open(paths["html"]) as f:
        html = f.read()
    assert html.count("data:image/png;base64,") == 4
    assert "<script" not in html and "http://" not in html and "https://" not in html


@pytest.mark.skipif(chromium.find() is None,
                    reason="no chromium binary on PATH (Debian: apt-get install -y chromium; scripts/setup.sh tries it as root)")
def test_report_in_headless_chromium(report):
    _, paths, _ = report
    art = os.environ.get("DYNVM_TEST_ARTIFACTS") or tempfile.mkdtemp(prefix="dvm-artifacts-")
    os.makedirs(art, exist_ok=True)
    png = os.path.join(art, "report.png")
    r = chromium.load("file://" + paths["html"], png)
    print(f"\nreport screenshot: {png}")
    assert r["errors"] == []
    assert r["title"] == "ms_dynvm report"
    assert len(r["images"]) == 4 and all(ok and w > 300 for ok, w in r["images"])
    assert os.path.getsize(png) > 20_000 and r["height"] > 1500


@pytest.mark.skipif(chromium.find() is None,
                    reason="no chromium binary on PATH (Debian: apt-get install -y chromium; scripts/setup.sh tries it as root)")
def test_chromium_check_sees_errors(tmp_path):
    """The check above can fail: a page with a console error, an exception and a missing image."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><head><title>bad</title></head><body><img src='missing.png'>"
                    "<script>console.error('boom'); undefinedFunction();</script></body></html>")
    r = chromium.load("file://" + str(page), str(tmp_path / "bad.png"))
    text = "\n".join(r["errors"])
    assert "console.error: boom" in text and "undefinedFunction" in text and "missing.png" in text
