"""The engine under the collectives: how a call's messages are posted, waited for and run.

- `partition`: where each rank's chunk, block or segment begins and ends.
- `tags`: which receive may match which message (the layout of the tag space).
- `transport`: `Step`, `Call`, `Traffic`; a step's MPI requests; a failed or oversized message
  told in words.
- `scratch`: the pool of large temporary buffers, reused across calls.
- `waiting`: how every wait behaves (timeouts, the watch for another call's messages, notices),
  and the waits of unrecorded calls (docs/engine.md, "Where a call waits").
- `plan`: a call's schedule recorded once (persistent requests bound to the real buffers, the
  arithmetic with its functions resolved), and the per-communicator cache of plans.
- `engine`: `Engine`, one per communicator: a call's lookup, recording and replay behind `run`,
  `start`, `persistent` and `free` (the Communicator only checks arguments).
- `executor`: runs a call: an unplanned call's generator (blocking, or nonblocking through a
  `CollectiveRequest`), a plan to the end, or a persistent request start by start.

`mpiring.ring.Ring` is the communicator seen as a ring, and the per-communicator state these
modules work on; the algorithms see only it (`post`, `scratch`, topology) and stay generators of
steps, so one algorithm serves the planned, the nonblocking and the device paths alike.
"""
