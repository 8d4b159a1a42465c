"""The engine under the collectives: split arithmetic, plans and the executor that runs them.

- `partition`: where each rank's chunk, block or segment begins and ends.
- `plan`: a call's schedule recorded once (persistent requests bound to the real buffers, the
  arithmetic with its functions resolved), and the per-communicator cache of plans.
- `executor`: runs a plan to the end for a blocking call, or start by start for a persistent
  request.

The transport (posting, the one place that waits, timeouts) and the driver of unplanned calls
live in mpiring.ring; the algorithms stay generators of steps, so one algorithm serves the
planned, the nonblocking and the device paths alike.
"""
