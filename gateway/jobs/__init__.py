"""Jobs and what happens to them: submission and admission (R1-R5, Q1), reading and locking, the stop state
machine (C3) and emergency stops and holds (C1, C2, C6), pause, resume, delete (A5, A6), priority and its history
(A2, A3, Q3), preemption and occupancy (P2, P3, Q8, Q9), runtime limits (Q6), quotas (A7, Q4, Q5), retention (P1,
R4), batches (H2), forensics (F4), the inventory (C1) and the statistics (Q10, Q11). Whatever runs the jobs is
reached only through the execution port it is given (gateway/execution/port.py).
"""
