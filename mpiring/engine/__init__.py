"""The engine under the collectives: plans and the executor that runs them.

- `plan`: a call's schedule recorded once (persistent requests bound to the real buffers, the
  arithmetic with its functions resolved), and the per-communicator cache of plans.
- `executor`: runs a plan to the end for a blocking call, or start by start for a persistent
  request.

The transport (posting, the one place that waits, timeouts) and the split arithmetic live in
mpiring.ring; the algorithms stay generators of steps, so one algorithm serves the planned,
the nonblocking and the device paths alike.
"""
