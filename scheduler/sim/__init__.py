"""The trace-replay simulator around the pure scheduling core (`scheduler`).

The core never imports this package. Rooms: `engine` (the event-driven clock and simulated
executor around `plan()`), `trace` (reading job traces), `workload` (turning a trace into
queued jobs and calendar bookings), `policies` (fifo, reservations-only, easy, gpubook),
`replay` (one workload under one policy), `metrics`, `report` (text table and HTML) and
`cli` (`python -m scheduler.sim`, `manage.py simulate`).
"""
