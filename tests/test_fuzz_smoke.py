"""The fuzz tools (bin/fuzz) keep working: a short run of each must do real work and find
nothing wrong. The long runs are opt-in (docs/testing.md)."""

from __future__ import annotations

import re

import fuzz_broker
import fuzz_codec
import pytest


def test_a_short_codec_fuzz_runs_thousands_of_inputs_without_a_crash(capsys: pytest.CaptureFixture[str]) -> None:
    assert fuzz_codec.main(["--inputs", "3000", "--seed", "7"]) == 0
    report = capsys.readouterr().out
    assert "seed 7: 3000 inputs" in report
    assert "crashes: 0" in report
    parsed = re.search(r"(\d+) frames parsed, (\d+) inputs ending in ProtocolError", report)
    assert parsed and int(parsed[1]) > 1000 and int(parsed[2]) > 100, report
    deadlines = re.search(r"ack deadlines passed: (\d+), late answers: (\d+)", report)
    assert deadlines and int(deadlines[1]) > 100 and int(deadlines[2]) > 50, report


def test_the_codec_fuzz_fails_and_names_the_replay_on_a_crash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(self, chunks, connect, rng):
        raise OverflowError("planted")

    monkeypatch.setattr(fuzz_codec.Harness, "run", broken)
    assert fuzz_codec.main(["--inputs", "5", "--seed", "7"]) == 1
    report = capsys.readouterr().out
    assert "crashes: 5" in report
    assert "replay: bin/fuzz codec --seed 7 --only 0" in report
    assert "OverflowError: planted" in report


def test_a_short_broker_fuzz_keeps_the_good_pair_whole(capsys: pytest.CaptureFixture[str]) -> None:
    assert fuzz_broker.main(["--seconds", "3", "--seed", "7", "--workers", "2"]) == 0
    report = capsys.readouterr().out
    assert "broker crashes: 0 (exit status 0)" in report
    assert "losses: 0, duplicates: 0, bad bodies: 0" in report
    counts = re.search(r"(\d+) mutated inputs .* over (\d+) connections.* (\d+) receipted", report)
    assert counts and int(counts[1]) > 50 and int(counts[3]) > 10, report
