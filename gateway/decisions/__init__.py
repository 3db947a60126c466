"""Deciding and recording every mutation (DESIGN, one mutation's path): the policy set and its engines, the
pipeline (decide, record first, ledger batches), facts about targets, obligations and notices (A4, A5), the
two-person rule (M2), rate and blast-radius limits (H2), the queue snapshot (H3), policy reload, and closing
decisions left without an outcome."""
