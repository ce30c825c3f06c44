"""The crash simulator: one runner (`runner`: seeds, processes, statistics, the failure
report and the command line, `bin/crashsim`) and a workload and a checker for each
state machine it plays, as TigerBeetle's VOPR keeps one simulator for many:

- the whole broker (`bin/crashsim --broker`): one seed drives real sessions, the real
  broker, the queue and the log core on a simulated disk, under a simulated clock that
  jumps, crashing at every step. `workload`: what the clients do (seeded random
  producers and consumers) and the seed's world (cap, clients, ack timeouts,
  heart-beats); `checker`: a model of what the broker promised (receipted SENDs and
  ACKs, who holds which message until when, delivery counts) and the invariants over
  it; `driver`: the steps, the clock, the crashes and restarts.
- a router in front of several brokers (`bin/crashsim --router`): one seed drives a
  RouterCore, its links as in-memory pipes to sessions of four instances (each the whole
  broker's world above), and clients of the router, crashing any instance, link or the
  router at random steps. `router_workload`, `router_checker` (the router's promises:
  receipted SENDs and ACKs, one holder, hand-backs uncounted, counts) and
  `router_driver`.
- the log (`bin/crashsim`): one seed drives curb.log.LogCore as the broker calls it, on
  the simulated disk with its faults and bit rot. `log_workload`: every choice of a
  seed; `log_checker`: the model of the log's crash promises and the invariants;
  `log_driver`: the steps against the log, the crashes and restarts.
"""
