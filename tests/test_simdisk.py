"""The simulated disk keeps the Disk contract and crashes the way the crash model says:
kill -9 keeps every completed write, power loss keeps only synced bytes for sure."""

import errno
import random

import pytest
from simdisk import SECTOR, Crashed, SimDisk


def disk(seed: int = 1, **options) -> SimDisk:
    return SimDisk(random.Random(seed), **options)


def test_reads_see_writes_at_once_and_short_only_at_the_end():
    d = disk()
    d.pwrite(b"hello", 10)
    assert d.size() == 15
    assert d.pread(5, 10) == b"hello"
    assert d.pread(20, 0) == bytes(10) + b"hello"
    assert d.pread(4, 100) == b""


def test_pwritev_writes_the_buffers_back_to_back():
    d = disk()
    d.pwritev([b"ab", b"", b"cd"], 3)
    assert d.pread(10, 0) == bytes(3) + b"abcd"


def test_allocate_grows_with_zeros_and_never_shrinks():
    d = disk()
    d.pwrite(b"x" * 100, 0)
    d.allocate(4096)
    assert d.size() == 4096
    assert d.pread(4096, 0) == b"x" * 100 + bytes(3996)
    d.allocate(10)
    assert d.size() == 4096


def test_allocate_past_the_free_space_is_enospc_and_changes_nothing():
    d = disk(free_bytes=8192)
    d.allocate(8192)
    with pytest.raises(OSError) as err:
        d.allocate(8193)
    assert err.value.errno == errno.ENOSPC
    assert d.size() == 8192


def test_a_write_growing_the_file_past_the_free_space_is_enospc():
    d = disk(free_bytes=1000)
    d.pwrite(b"a" * 1000, 0)
    with pytest.raises(OSError) as err:
        d.pwrite(b"b", 1000)
    assert err.value.errno == errno.ENOSPC
    d.pwrite(b"c", 999)
    assert d.pread(2, 998) == b"ac"


def test_negative_offsets_are_refused():
    d = disk()
    with pytest.raises(OSError):
        d.pwrite(b"x", -1)
    with pytest.raises(OSError):
        d.pread(1, -1)


def test_a_closed_disk_refuses_io():
    d = disk()
    d.close()
    with pytest.raises(ValueError):
        d.pread(1, 0)


def test_kill_keeps_every_completed_write_but_not_as_durable():
    d = disk()
    d.pwrite(b"synced", 0)
    d.sync()
    d.pwrite(b"later", 6)
    after = d.crash("kill")
    assert after.pread(11, 0) == b"syncedlater"
    assert after.durable_image() == b"synced"
    assert after.unsynced_writes() == 1
    assert after.crash("kill").pread(11, 0) == b"syncedlater"


def test_a_sync_after_a_kill_makes_the_old_writes_durable():
    d = disk()
    d.pwrite(b"old", 0)
    after = d.crash("kill")
    after.sync()
    assert after.crash("power").pread(3, 0) == b"old"


def test_power_loss_keeps_everything_synced():
    for seed in range(50):
        d = disk(seed)
        d.pwrite(b"a" * 3000, 0)
        d.sync()
        d.pwrite(b"b" * 2000, 500)
        after = d.crash("power")
        image = after.pread(3000, 0)
        assert len(image) == 3000
        assert set(image[:500]) == {ord("a")} and set(image[2500:]) == {ord("a")}


def test_power_loss_tears_writes_only_at_sector_boundaries():
    seen = set()
    for seed in range(1000):
        d = disk(seed)
        d.pwrite(b"a" * (4 * SECTOR), 0)
        d.sync()
        d.pwrite(b"b" * (4 * SECTOR), 0)
        image = d.crash("power").pread(4 * SECTOR, 0)
        sectors = [image[i : i + SECTOR] for i in range(0, len(image), SECTOR)]
        assert all(s in (b"a" * SECTOR, b"b" * SECTOR) for s in sectors)
        seen.add(tuple(s[0] for s in sectors))
    assert len(seen) == 16


def test_power_loss_keeps_any_combination_of_writes_in_order():
    outcomes = set()
    for seed in range(300):
        d = disk(seed)
        d.pwrite(b"1", 0)
        d.pwrite(b"2", 0)
        d.pwrite(b"3", 1)
        outcomes.add(d.crash("power").pread(2, 0))
    assert outcomes == {b"", b"1", b"2", b"\x003", b"13", b"23"}


def test_power_loss_may_drop_an_unsynced_allocation():
    sizes = set()
    for seed in range(50):
        d = disk(seed)
        d.pwrite(b"x" * 100, 0)
        d.sync()
        d.allocate(8192)
        sizes.add(d.crash("power").size())
    assert sizes == {100, 8192}


def test_a_power_loss_without_some_writes_keeps_every_other_one():
    d = disk()
    d.pwrite(b"a" * 10, 0)
    d.sync()
    d.allocate(4096)
    d.pwrite(b"b" * 10, 0)
    d.pwrite(b"c" * 10, 1000)
    after = d.power_loss_without({0})
    assert after.size() == 4096
    assert after.pread(10, 0) == b"a" * 10 and after.pread(10, 1000) == b"c" * 10
    assert after.unsynced_writes() == 0


def test_a_failed_sync_makes_nothing_durable():
    d = disk(sync_eio=1.0)
    d.pwrite(b"x", 0)
    with pytest.raises(OSError) as err:
        d.sync()
    assert err.value.errno == errno.EIO
    assert d.durable_image() == b""
    assert d.faults == 1


def test_a_failed_write_leaves_at_most_a_whole_sector_prefix():
    prefixes = set()
    for seed in range(50):
        d = disk(seed, write_eio=1.0)
        with pytest.raises(OSError):
            d.pwrite(b"z" * (3 * SECTOR), 0)
        image = d.pread(3 * SECTOR, 0)
        assert image == b"z" * len(image) and len(image) % SECTOR == 0
        prefixes.add(len(image))
    assert prefixes == {0, SECTOR, 2 * SECTOR, 3 * SECTOR}


def test_the_same_seed_replays_the_same_crash():
    def run(seed: int) -> bytes:
        d = disk(seed)
        for i in range(40):
            d.pwrite(bytes([i]) * 700, i * 300)
            if i % 7 == 0:
                d.sync()
        return d.crash("power").visible_image()

    assert run(5) == run(5)
    assert len({run(s) for s in range(10)}) > 1


def test_corruption_helpers_damage_the_medium():
    d = disk()
    d.pwrite(b"\x00" * (2 * SECTOR), 0)
    d.sync()
    d.flip_bit(3, 2)
    assert d.pread(4, 0) == b"\x00\x00\x00\x04"
    d.pwrite(b"\xff" * (2 * SECTOR), 0)
    d.zero_sector(1)
    assert d.pread(2 * SECTOR, 0) == b"\xff" * SECTOR + bytes(SECTOR)
    assert d.durable_image() == b"\x00\x00\x00\x04" + bytes(2 * SECTOR - 4)


def test_unknown_crash_mode_is_refused():
    with pytest.raises(ValueError):
        disk().crash("flood")


def test_an_armed_crash_strikes_before_the_nth_operation_and_does_nothing():
    d = disk()
    d.arm_crash(2)
    d.pwrite(b"a", 0)
    d.allocate(100)
    with pytest.raises(Crashed):
        d.pwritev([b"b"], 1)
    assert d.pread(2, 0) == b"a\x00"
    d.sync()
    assert d.durable_image()[:1] == b"a"
    assert d.crash("kill").crash_in is None


def test_crashed_is_no_error_the_code_under_test_could_catch():
    assert not issubclass(Crashed, Exception)
