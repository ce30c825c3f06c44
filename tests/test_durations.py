"""Durations on the command line (curb.durations): units, a plain number as seconds for
every duration flag of `curb` and `curb router`, bounds."""

import click
import pytest

from curb import durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("10s", 10.0),
        ("30m", 1800.0),
        ("2h", 7200.0),
        ("1.5s", 1.5),
        ("5", 5.0),
        ("0.2", 0.2),
        ("0", 0.0),
        (" 3 s ", 3.0),
    ],
)
def test_a_duration_is_seconds(text, seconds):
    assert durations.parse(text) == seconds


@pytest.mark.parametrize("text", ["", "s", "-1s", "nan", "inf", "1e3", "5 d", "10sec", "1,5s"])
def test_anything_else_is_refused_with_the_units(text):
    with pytest.raises(ValueError, match="500ms, 10s, 30m or 2h"):
        durations.parse(text)


@pytest.mark.parametrize(("seconds", "text"), [(7200, "2h"), (90, "90s"), (1800, "30m"), (0.25, "250ms"), (0, "0ms")])
def test_a_duration_is_written_in_its_largest_exact_unit(seconds, text):
    assert durations.format_seconds(seconds) == text


def test_the_click_type_bounds_and_says_what_zero_means():
    kind = durations.Duration(60, zero="no limit")
    assert kind.convert("1m", None, None) == 60
    with pytest.raises(click.BadParameter, match=r"longer than the most allowed, 1m; 0 for no limit"):
        kind.convert("61s", None, None)
    with pytest.raises(click.BadParameter, match=r"plain number is seconds\); 0 for no limit"):
        kind.convert("x", None, None)


def duration_flags() -> list[tuple[str, click.Option]]:
    """Every duration flag of `curb` and `curb router`, as (command, option)."""
    from curb.cli import command
    from curb.router.cli import router_command

    return [
        (name, param)
        for name, cmd in (("curb", command), ("curb router", router_command))
        for param in cmd.params
        if isinstance(param, click.Option) and isinstance(param.type, durations.Duration)
    ]


FLAGS = duration_flags()


@pytest.mark.parametrize(("cmd", "option"), FLAGS, ids=[f"{cmd} {option.opts[0]}" for cmd, option in FLAGS])
def test_every_duration_flag_reads_a_plain_number_as_seconds_and_says_so(cmd, option):
    assert option.type.convert("5", option, None) == 5.0
    assert option.type.convert("250ms", option, None) == 0.25
    assert "a plain number is seconds" in (option.help or ""), f"{cmd} {option.opts[0]} --help: {option.help!r}"


def test_the_duration_flags_are_all_found():
    found = {option.opts[0] for _, option in FLAGS}
    assert {"-heartbeat", "-ack-timeout", "-redelivery-delay", "-link-heartbeat", "-link-wait"} <= found
