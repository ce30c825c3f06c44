"""curb.arrivals as tables: at most `most` handshakes run, the rest wait in order of
arrival, a place freed starts the next, one that leaves while waiting never starts, and
while any wait one more starts each `every` seconds, places or not."""

from __future__ import annotations

from curb.arrivals import Arrivals


class Recorder:
    def __init__(self) -> None:
        self.started: list[str] = []

    def start(self, name: str):
        return lambda: self.started.append(name)


def run(starts) -> None:
    for start in starts:
        start()


def test_at_most_most_start_and_the_rest_wait_in_order():
    r, a = Recorder(), Arrivals(most=2, every=1.0)
    places = {}
    for name in "abcd":
        places[name], starts = a.arrive(r.start(name), now=0.0)
        run(starts)
    assert r.started == ["a", "b"] and a.started == 2 and len(a.waiting) == 2
    run(a.settled(places["b"]))
    assert r.started == ["a", "b", "c"]
    run(a.settled(places["a"]))
    assert r.started == ["a", "b", "c", "d"] and not a.waiting
    run(a.settled(places["c"]))
    run(a.settled(places["d"]))
    assert a.started == 0


def test_one_that_leaves_while_waiting_never_starts_and_settling_twice_is_harmless():
    r, a = Recorder(), Arrivals(most=1, every=1.0)
    first, starts = a.arrive(r.start("a"), now=0.0)
    run(starts)
    second, starts = a.arrive(r.start("b"), now=0.0)
    _, more = a.arrive(r.start("c"), now=0.0)
    assert starts == [] and more == []
    run(a.settled(second))  # gone while it waited
    run(a.settled(second))
    run(a.settled(first))
    assert r.started == ["a", "c"] and a.started == 1 and not a.waiting
    run(a.settled(first))
    assert a.started == 1


def test_while_any_wait_one_more_starts_each_every_seconds_places_or_not():
    r, a = Recorder(), Arrivals(most=1, every=0.05)
    assert a.next_tick is None
    for name in "abc":
        _, starts = a.arrive(r.start(name), now=1.0)
        run(starts)
    assert r.started == ["a"] and a.next_tick == 1.05
    run(a.tick(1.04))
    assert r.started == ["a"]
    run(a.tick(1.05))  # the silent first one still holds its place
    assert r.started == ["a", "b"] and a.started == 2 and a.next_tick == 1.1
    run(a.tick(1.2))
    assert r.started == ["a", "b", "c"] and a.next_tick is None
    run(a.tick(2.0))
    assert r.started == ["a", "b", "c"]
