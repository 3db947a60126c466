"""jobgate's own execution (DESIGN, execution behind a port): the scheduler loop that places jobs with the pure
core (scheduler/), signed commands to node agents (H1) and the channel they answer on (heartbeats, reports of
process events, anomalies, F3), node health (lost nodes, reconciliation after a restart) and agent wake-ups. It
implements gateway/execution/port.py; it may import jobs/ to apply what nodes report.
"""
