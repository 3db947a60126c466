"""Exception hierarchy of the ledger package: one root, structured subclasses.

Libraries raise; only the edge (the CLI, the gateway's error mapper) turns these into exit codes or
problem+json. Foreign exceptions (sqlite3, psycopg, binascii, nacl, rfc8785) are translated where
they happen, so callers only ever need ``except LedgerError``.
"""

from __future__ import annotations


class LedgerError(Exception):
    """Root of every error the ledger package raises."""

    def diagnostics(self) -> str:
        """One line suitable for an operator."""
        return str(self) or type(self).__name__


class InvalidEntry(LedgerError):
    """The caller's kind/body/blobs cannot be encoded as an RFC 8785 ledger entry."""


class LedgerUnavailable(LedgerError):
    """The ledger could not make an append durable; the gateway must fail closed."""


class LedgerClosed(LedgerUnavailable):
    """append() after close()."""


class LedgerCorrupted(LedgerError):
    """The store's tail does not match its own checkpoint at open; refusing to append onto it."""


class StoreError(LedgerError):
    """The store URL is unusable (unknown scheme, missing file, missing tables, connection refused)."""


class EntryNotFound(LedgerError):
    """No entry with this sequence number."""

    def __init__(self, seq: int) -> None:
        super().__init__(f"no ledger entry with seq {seq}")
        self.seq = seq


class ProofError(LedgerError):
    """A proof was requested for sizes/indices the tree does not have."""


class KeyFormatError(LedgerError):
    """A signer or verifier key string (or key file) is malformed."""


class KeyMismatch(LedgerError):
    """The key file on disk belongs to a different key name than the one asked for."""


class NoteError(LedgerError):
    """A signed note or checkpoint could not be opened."""


class MalformedNote(NoteError):
    """The note text does not follow C2SP signed-note / tlog-checkpoint syntax."""


class UnknownKey(NoteError):
    """No signature line in the note belongs to the verifier's key (name and key id)."""


class BadSignature(NoteError):
    """A signature line from the verifier's key does not verify."""


class BundleError(LedgerError):
    """The bundle file is unreadable, truncated, corrupt or not a bundle; or an export is impossible."""
