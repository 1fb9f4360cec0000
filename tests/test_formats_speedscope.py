"""-f speedscope: the file is valid against the schema speedscope's npm
package ships, holds the known chain with exact weights, and speedscope's
own web app (from the same package) opens it in headless Chromium: its
Sandwich view lists the chain's functions with their counts (DOM text;
the flame views are canvas), a screenshot of each view is kept."""
from __future__ import annotations

import json

import pytest

from browser import chromium, keep_screenshot, network_requests  # noqa: F401 (fixture)
from helpers import (CHAIN, FP, NOT_INSTALLED, SPEEDSCOPE, build, open_in_speedscope,
                     run_counts, sandwich_rows, write_report)

from ustack.report.formats import ReportContext

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def chain():
    return build("chain", flags=FP)


def validate(document: dict) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="pip install -e '.[test]'")
    schema_path = SPEEDSCOPE / "file-format-schema.json"
    if not schema_path.exists():
        pytest.skip(NOT_INSTALLED)
    jsonschema.validate(document, json.loads(schema_path.read_text()))


def frame_names(document: dict, sample: list) -> list:
    return [document["shared"]["frames"][i]["name"] for i in sample]


def test_chain_valid_and_exact(chain, tmp_path):
    """Two events, two profiles, each the chain (outermost first) with the
    exact count of calls as its weight: c once, d 9 times."""
    counted, labels = run_counts("count", [f"uprobe:{chain}:d", f"uprobe:{chain}:c"],
                                 f"{chain} 9")
    path = write_report("speedscope", counted, tmp_path / "chain.speedscope.json",
                        ReportContext(command="count", events=tuple(labels)))
    document = json.loads(path.read_text())
    validate(document)
    profiles = {p["name"]: p for p in document["profiles"]}
    assert set(profiles) == set(labels)
    for label, leaf, n in zip(labels, ("d", "c"), (9, 1)):
        p = profiles[label]
        assert p["unit"] == "none" and p["weights"] == [n] and p["endValue"] == n
        [sample] = p["samples"]
        names = frame_names(document, sample)
        inner = CHAIN[CHAIN.index(leaf):]
        assert names[-len(inner):] == inner[::-1]
    files = {f["name"]: f.get("file") for f in document["shared"]["frames"]}
    assert files["d"] == str(chain)


def test_profile_weights_are_time(tmp_path):
    busy = build("busy", flags=FP)
    hz = 199
    counted, labels = run_counts("profile", [f"profile:hz:{hz}"], f"{busy} 0.5")
    context = ReportContext(command="profile", events=tuple(labels), frequency=hz)
    path = write_report("speedscope", counted, tmp_path / "busy.speedscope.json", context)
    document = json.loads(path.read_text())
    validate(document)
    [p] = document["profiles"]
    assert p["unit"] == "nanoseconds"
    assert sum(p["weights"]) == sum(sc.count for sc in counted) * (1_000_000_000 // hz)


def test_opened_by_speedscope(chain, tmp_path, chromium):  # noqa: F811 (fixture)
    counted, labels = run_counts("count", [f"uprobe:{chain}:d"], f"{chain} 7")
    path = write_report("speedscope", counted, tmp_path / "chain.speedscope.json",
                        ReportContext(command="count", events=tuple(labels)))
    open_in_speedscope(chromium, path)
    keep_screenshot(chromium, "speedscope-chain-time-order")
    rows = sandwich_rows(chromium)
    keep_screenshot(chromium, "speedscope-chain-sandwich")
    # three lines a function: total, self, name; d has all 7 as self time
    by_name = {rows[i + 2]: (rows[i], rows[i + 1]) for i in range(0, len(rows), 3)}
    assert set(CHAIN) <= set(by_name)
    assert by_name["d"] == ("7 (100%)", "7 (100%)")
    for name in CHAIN[1:]:
        assert by_name[name][0] == "7 (100%)"
    assert all(url.startswith("file://") for url in network_requests(chromium))
