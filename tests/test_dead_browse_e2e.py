"""A browse of `./dead` on a real broker while a redrive runs: the browse takes the dead
letters by id in slices, so it goes on where it was, shows each dead letter once,
oldest first, none the redrive moved before its turn, and ends with its marker."""

from __future__ import annotations

from benchmark.parked import dead_letter_all, store

from curb.client import Client

LETTERS = 4000
BODY = b"d" * 8192  # enough that the browse cannot be sent whole before the redrive


def test_a_dead_browse_during_a_redrive_shows_each_letter_once_oldest_first_and_ends(curb_broker):
    broker = curb_broker(cap="256MiB")
    store(broker.port, LETTERS, {"curb-ttl": "1"}, BODY)
    dead_letter_all(broker.port, LETTERS)
    with Client("127.0.0.1", broker.port, timeout=30) as reader, Client("127.0.0.1", broker.port) as admin:
        browse = reader.browse(destination="./dead", sub_id="dead")
        first = next(browse)
        admin.send(b"", receipt="redriven", destination="./redrive")
        moved = admin.receive()
        assert (moved.command, moved.headers.get("receipt-id")) == ("RECEIPT", "redriven")
        assert moved.headers["curb-moved"] == str(LETTERS)  # a browse holds none of them
        ids = [int(first.headers["message-id"])] + [int(f.headers["message-id"]) for f in browse]
        assert ids == sorted(set(ids))  # oldest first, each once
        assert len(ids) < LETTERS  # those the redrive moved before their turn are not shown
        assert reader.last_browsed >= ids[-1]
        assert list(reader.browse(destination="./dead", sub_id="again")) == []
