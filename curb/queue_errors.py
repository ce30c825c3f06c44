"""The queue's refusals as exceptions, in a module of their own: curb.queue is compiled
(mypyc) and a compiled class cannot be subclassed by a pure-Python one, such as
curb.send_rule's BadSend."""

from __future__ import annotations


class QueueError(Exception):
    """A client asked for something the queue state does not allow.

    str() is a short reason, fit for the `message` header of an ERROR frame; `advice`,
    for its body, says what the client should do instead (every raise must give one).
    """

    def __init__(self, reason: str, advice: str):
        super().__init__(reason)
        self.advice = advice


class Late(QueueError):
    """An ACK, NACK or touch of a message whose ack deadline passed while this connection
    held it: the message is back in the queue (or with another consumer) and this
    changes nothing."""
