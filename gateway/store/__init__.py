"""The business database: engine and sessions, every table, the job states (R1: job rows are never deleted).

Imports nothing else of the gateway but its shared top modules; every room above reads and writes through it.
"""
