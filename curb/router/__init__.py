"""`curb router`: a STOMP 1.2 router in front of Curb instances (destinations, partitioned
queues, transactions). `core` holds the forwarding rules, sans I/O; `glue` moves bytes;
`routes` parses routes; `cli` is the command."""
