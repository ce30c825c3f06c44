"""`curb inspect`: what is in a log file, read offline without taking its lock.

Meant for the operator of a stuck or full queue: one short summary (how many
messages wait and since when, whether some keep coming back, how full the file
is, whether a crash tore the tail) and, on request, the messages themselves.
"""

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import click

from curb.log.scan import Entry, LogDamaged, LogError, LogReader, Summary

PREVIEW_BYTES = 64
DEFAULT_LIMIT = 20


class _Unusable(click.ClickException):
    """A file that cannot be used (not a curb log, not readable): exit status 2, as the broker's."""

    exit_code = 2


class _Damaged(click.ClickException):
    """A curb log whose header is damaged: exit status 3, as the broker's."""

    exit_code = 3


@dataclass
class _Findings:
    """What one pass over the entries tells beyond the log's own summary."""

    oldest: Entry | None = None
    redelivered: int = 0
    most_delivered: Entry | None = None
    listed: list[Entry] = field(default_factory=list)
    unlisted: int = 0


def _scan(reader: LogReader, list_states: set[str], limit: int) -> _Findings:
    found = _Findings()
    for entry in reader.entries():
        if entry.state == "rdy":
            found.oldest = found.oldest or entry
            if entry.deliveries:
                found.redelivered += 1
                if found.most_delivered is None or entry.deliveries > found.most_delivered.deliveries:
                    found.most_delivered = entry
        if entry.state in list_states:
            if limit == 0 or len(found.listed) < limit:
                found.listed.append(entry)
            else:
                found.unlisted += 1
    return found


@click.command("inspect")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--messages", is_flag=True, help="Also list the waiting (rdy) messages, in queue order.")
@click.option("--acked", is_flag=True, help="List acked records not yet reclaimed too (implies --messages).")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    help=f"List at most N messages, 0 for all (implies --messages; default {DEFAULT_LIMIT}).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def inspect_command(path: str, messages: bool, acked: bool, limit: int | None, as_json: bool) -> None:
    """Tell what is in the Curb log file PATH.

    Read-only and lock-free, so it is safe on the log of a running broker (whose
    in-flight messages show as rdy: wip is not kept on disk). Exits as the broker would
    on the same file: 2 if it is not a curb log, 3 if its header is damaged, 1 on an
    I/O error.
    """
    messages = messages or acked or limit is not None  # asking how to list is asking for a list
    limit = DEFAULT_LIMIT if limit is None else limit
    try:
        with LogReader(path) as reader:
            summary = reader.summary()
            live = {"rdy", "max", "exp"}  # dead letters are kept messages too
            list_states = (live | {"ack"} if acked else live) if messages else set()
            found = _scan(reader, list_states, limit)
    except LogDamaged as error:
        raise _Damaged(str(error)) from None
    except LogError as error:
        raise _Unusable(str(error)) from None
    except OSError as error:
        raise click.ClickException(f"cannot read {path}: {error.strerror or error}") from None
    now_ms = time.time_ns() // 1_000_000
    if as_json:
        document: dict[str, dict[str, object] | list[dict[str, object]]] = {
            "summary": _summary_json(summary, found, now_ms)
        }
        if messages:
            document["messages"] = [_entry_json(entry, now_ms) for entry in found.listed]
        click.echo(json.dumps(document, indent=2))
        return
    click.echo(_summary_text(summary, found, now_ms))
    if messages:
        click.echo(_messages_text(found, now_ms, limit))


def _summary_text(summary: Summary, found: _Findings, now_ms: int) -> str:
    lines = [f"curb log {summary.path}"]
    waiting = f"{summary.messages:,} rdy" + (" (queue empty)" if summary.messages == 0 else "")
    lines.append(
        f"  messages  {waiting}, {summary.delayed:,} delayed, {summary.dead:,} dead letters, "
        f"{summary.acked:,} ack not yet reclaimed"
    )
    lines.append(f"  oldest    {'-' if found.oldest is None else _describe(found.oldest, now_ms)}")
    lines.append(f"  retried   {_retried(found)}")
    lines.append(
        f"  space     live {_size(summary.live_bytes)} ({_of_cap(summary.live_bytes, summary.cap)}), "
        f"dead {_size(summary.dead_bytes)}, file {_size(summary.file_bytes)}"
    )
    if summary.torn is None:
        lines.append("  tail      clean")
    else:
        lines.append(f"  tail      TORN: {summary.torn}")
        lines.append("            an unfinished write (a crash, or one in progress on a running broker):")
        lines.append("            never acknowledged to its producer; the broker drops it when it starts")
    return "\n".join(lines)


def _retried(found: _Findings) -> str:
    """How many waiting messages came back after a delivery, and the worst one: a poison message shows here."""
    if found.oldest is None:
        return "-"
    if found.most_delivered is None:
        return "none of them delivered before"
    worst = found.most_delivered
    return f"{found.redelivered:,} of them delivered before; most: #{worst.id}, {_delivered(worst.deliveries)}"


def _messages_text(found: _Findings, now_ms: int, limit: int) -> str:
    if not found.listed:
        return "\nno messages to list"
    lines = [""]
    for entry in found.listed:
        lines.append(
            f"#{entry.id} {entry.state}, {_describe(entry, now_ms, with_id=False)}, {_size(len(entry.body))} body"
        )
        lines.extend(f"    {_escape(name)}: {_escape(value)}" for name, value in entry.headers.items())
        lines.append(f"    body: {_preview(entry.body)}")
    if found.unlisted:
        lines.append(f"... {found.unlisted:,} more not listed (--limit {limit}; --limit 0 lists all)")
    return "\n".join(lines)


def _describe(entry: Entry, now_ms: int, with_id: bool = True) -> str:
    sent = datetime.fromtimestamp(entry.timestamp_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = f"sent {_age(now_ms - entry.timestamp_ms)} ago ({sent}), {_delivered(entry.deliveries)}"
    return f"#{entry.id}, {text}" if with_id else text


def _summary_json(summary: Summary, found: _Findings, now_ms: int) -> dict[str, object]:
    return {
        "path": str(summary.path),
        "file_bytes": summary.file_bytes,
        "cap": summary.cap,
        "messages": summary.messages,
        "acked": summary.acked,
        "delayed": summary.delayed,
        "dead_letters": summary.dead,
        "live_bytes": summary.live_bytes,
        "dead_bytes": summary.dead_bytes,
        "oldest_timestamp_ms": summary.oldest_timestamp_ms,
        "oldest_age_seconds": None
        if summary.oldest_timestamp_ms is None
        else max(0, now_ms - summary.oldest_timestamp_ms) / 1000,
        "redelivered_messages": found.redelivered,
        "most_delivered": None
        if found.most_delivered is None
        else {"id": found.most_delivered.id, "deliveries": found.most_delivered.deliveries},
        "torn": summary.torn,
    }


def _entry_json(entry: Entry, now_ms: int) -> dict[str, object]:
    return {
        "id": entry.id,
        "state": entry.state,
        "deliveries": entry.deliveries,
        "timestamp_ms": entry.timestamp_ms,
        "due_ms": entry.due_ms,
        "expires_ms": entry.expires_ms,
        "age_seconds": max(0, now_ms - entry.timestamp_ms) / 1000,
        "offset": entry.offset,
        "size": entry.size,
        "headers": entry.headers,
        "body_bytes": len(entry.body),
        "body_preview": _preview(entry.body),
    }


def _preview(body: bytes) -> str:
    """The first PREVIEW_BYTES of a body on one line: text as is, anything else escaped."""
    if not body:
        return "(empty)"
    text = _escape(body[:PREVIEW_BYTES].decode("utf-8", errors="surrogateescape"))
    if len(body) > PREVIEW_BYTES:
        text += f" ... ({len(body) - PREVIEW_BYTES:,} more bytes)"
    return text


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(text: str) -> str:
    """Text kept readable on one line: control characters and undecodable bytes (surrogate escapes) escaped."""
    out = []
    for char in text:
        code = ord(char)
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif not char.isprintable():
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def _age(ms: int) -> str:
    seconds = max(0, ms) // 1000
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{seconds:02d}s"
    return f"{seconds}s"


def _delivered(count: int) -> str:
    return {0: "never delivered", 1: "delivered once"}.get(count, f"delivered {count:,} times")


def _size(n: int) -> str:
    value, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


def _of_cap(live: int, cap: int | None) -> str:
    if cap is None:  # written by a broker from before the header recorded it
        return "cap not recorded in this file: the broker records it when it next opens the file"
    return f"{100 * live / cap:.0f}% of cap {_size(cap)}"
