"""The whole-broker simulator: one seed drives real sessions, the real broker, the queue
and the log core on a simulated disk, under a simulated clock that jumps, crashing at
every step.

It is kept in three parts, as TigerBeetle keeps its simulator:
- `workload`: what the clients do (seeded random producers and consumers) and the
  seed's world (cap, clients, ack timeouts, heart-beats);
- `checker`: a model of what the broker promised (receipted SENDs and ACKs, who holds
  which message until when, delivery counts) and the invariants over it;
- `driver`: the steps, the clock, the crashes and restarts, and the command line
  (`bin/crashsim --broker`).
"""
