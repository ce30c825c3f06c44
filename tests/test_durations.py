"""Durations on the command line (curb.durations): units, the plain unit, bounds."""

import click
import pytest

from curb import durations


@pytest.mark.parametrize(
    ("text", "plain", "seconds"),
    [
        ("250ms", "s", 0.25),
        ("10s", "ms", 10.0),
        ("30m", "s", 1800.0),
        ("2h", "s", 7200.0),
        ("1.5s", "s", 1.5),
        ("5000", "ms", 5.0),
        ("10", "s", 10.0),
        ("0", "ms", 0.0),
        (" 3 s ", "s", 3.0),
    ],
)
def test_a_duration_is_seconds(text, plain, seconds):
    assert durations.parse(text, plain) == seconds


@pytest.mark.parametrize("text", ["", "s", "-1s", "nan", "inf", "1e3", "5 d", "10sec", "1,5s"])
def test_anything_else_is_refused_with_the_units(text):
    with pytest.raises(ValueError, match="500ms, 10s, 30m or 2h"):
        durations.parse(text, "s")


@pytest.mark.parametrize(("seconds", "text"), [(7200, "2h"), (90, "90s"), (1800, "30m"), (0.25, "250ms"), (0, "0ms")])
def test_a_duration_is_written_in_its_largest_exact_unit(seconds, text):
    assert durations.format_seconds(seconds) == text


def test_the_click_type_bounds_and_says_what_zero_means():
    kind = durations.Duration("ms", 60, zero="no limit")
    assert kind.convert("1m", None, None) == 60
    with pytest.raises(click.BadParameter, match=r"longer than the most allowed, 1m; 0 for no limit"):
        kind.convert("61s", None, None)
    with pytest.raises(click.BadParameter, match=r"plain number is in milliseconds\); 0 for no limit"):
        kind.convert("x", None, None)
