"""Size classes: the bound on the largest live record, kept as records come and go."""

from __future__ import annotations

from curb.log.sizes import SizeClasses, class_bound, size_class


def test_the_bound_follows_the_largest_record_in_use():
    classes = SizeClasses()
    assert classes.largest == 0
    for size in (100, 5000, 300):
        classes.add(size)
    assert 5000 <= classes.largest <= 5000 * 5 // 4
    classes.remove(5000)
    assert 300 <= classes.largest <= 300 * 5 // 4
    classes.remove(100)
    classes.remove(300)
    assert (classes.largest, classes.top, classes.total) == (0, 0, 0)


def test_an_emptied_queue_starts_from_nothing_and_counts_never_go_below_zero():
    classes = SizeClasses()
    classes.add(70_000, 3)
    classes.remove(70_000)
    assert classes.largest == class_bound(size_class(70_000))
    for _ in range(5):  # more than were added: damage can make a count err
        classes.remove(70_000)
    assert (classes.largest, classes.total) == (0, 0)
    classes.add(200)
    assert classes.top == size_class(200)
