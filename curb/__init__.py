"""Curb: one durable work queue behind a STOMP 1.2 port, kept in one capped log file."""

__version__ = "0.1.0"
