"""jobgate audit ledger: RFC 8785 entries, RFC 6962 Merkle tree, C2SP signed checkpoints.

Usable on its own by an auditor: see ledger.verify.verify_store and `jobgate ledger verify`.
"""

from __future__ import annotations

from ledger.errors import (
    EntryNotFound,
    InvalidEntry,
    LedgerClosed,
    LedgerCorrupted,
    LedgerError,
    LedgerUnavailable,
    StoreError,
)
from ledger.keys import NoteSigner, NoteVerifier, load_or_create_signer
from ledger.proofs import ConsistencyProof, InclusionProof
from ledger.service import AppendResult, Ledger, StoredEntry
from ledger.verify import Verdict, verify_store

__all__ = [
    "AppendResult",
    "ConsistencyProof",
    "EntryNotFound",
    "InclusionProof",
    "InvalidEntry",
    "Ledger",
    "LedgerClosed",
    "LedgerCorrupted",
    "LedgerError",
    "LedgerUnavailable",
    "NoteSigner",
    "NoteVerifier",
    "StoreError",
    "StoredEntry",
    "Verdict",
    "load_or_create_signer",
    "verify_store",
]
