"""The engine under the collectives: how a call's messages are posted, waited for and run.

- `ring`: `Ring`, the communicator seen as a ring, and the per-communicator state these modules
  work on; the algorithms see only it (`post`, `scratch`, topology) and stay generators of
  steps, so one algorithm serves the planned, the nonblocking and the device paths alike.
- `partition`: where each rank's chunk, block or segment begins and ends.
- `tags`: which receive may match which message (the layout of the tag space).
- `transport`: `Step`, `Call`, `Traffic`; a step's MPI requests; a failed or oversized message
  told in words.
- `scratch`: the pool of large temporary buffers, reused across calls.
- `waiting`: how every wait behaves (timeouts, the watch for another call's messages, notices),
  and the waits of unrecorded calls (docs/engine.md, "Where a call waits").
- `recording`: the one recording type: a call's steps recorded once (`Recorder`, `fuse`) as
  exchanges, replayed by `run`; what a call seen once leaves (`SeenOnce`).
- `schedule`: its binding by layout: a blocking host call, bound to each call's arrays.
- `plan`: its binding for life: a device call, bound to its arrays (persistent requests on the
  real buffers, the arithmetic with its functions resolved).
- `cache`: the per-communicator cache of schedules and plans.
- `native`: the Python binding to the C replay (`replay_c/`): schedules and plans run as plain
  data, and the C Shortcut of a cached blocking call.
- `run`: runs a call to its end, blocking: an unrecorded call's generator, or a schedule or plan
  (in C through `native` where it was built).
- `requests`: the requests of nonblocking (`CollectiveRequest`) and persistent
  (`PersistentRequest`) calls, advanced by test() and wait().
- `engine`: `Engine`, one per communicator: a call's lookup, recording and replay behind `run`,
  `start`, `persistent` and `free` (the Communicator only checks arguments).
- `farewell`: free() letting go of the MPI communicator without leaving a message behind that a
  later communicator could match.
"""
