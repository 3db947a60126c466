"""Live policy reload with last-good fallback (DESIGN "Policies", issue 4 item 5).

A candidate set is accepted only if it loads (compiles, file:line problems otherwise), passes its own
test suite (policies/tests: Rego `test_` rules and YAML table cases) and, for the OPA engine, the server
takes it. Every attempt — accepted or refused — is recorded in the ledger (kind `policy`) with the
candidate's hash and its errors *before* the new set becomes active; if the ledger cannot be written the
set is refused too. A refused set changes nothing: the previous engine keeps deciding.

A watcher thread polls the directory's file stamps every `policy_watch_interval_s` and attempts a
reload when they change; a candidate that was already refused is not retried until it changes again.

Replicas (PostgreSQL): a set loaded here, at start or by a reload, becomes the set in force for every replica of
the business database, and a set another replica loaded is adopted from this replica's own files before it decides
again (gateway/decisions/policy_sync.py).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gateway.decisions.deps import PolicyHolder
from gateway.decisions.policy.errors import PolicyError, PolicyLoadError, PolicyProblem
from gateway.decisions.policy.factory import make_engine
from gateway.decisions.policy.loader import policy_files, policy_hash
from gateway.decisions.policy.testing import load_tested_set
from gateway.decisions.policy_sync import PolicyOutOfStep, load_bindings
from gateway.errors import GatewayError
from ledger.errors import LedgerError

log = logging.getLogger("jobgate.policy")

HISTORY = 50


class PolicyRefused(GatewayError):
    """The candidate policy set was refused; `errors` lists `file:line: message`. The old set stays."""

    status, kind, title = 422, "policy-refused", "Policy set refused; the previous set stays active"


@dataclass(frozen=True)
class LoadAttempt:
    """One load attempt, as GET /v1/policy shows it and the ledger records it."""

    at: datetime
    trigger: str  # startup | api | watch
    by: str
    policy_hash: str
    result: str  # loaded | refused | unchanged
    errors: tuple[str, ...] = ()
    ledger_seq: int | None = None
    previous_hash: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "trigger": self.trigger,
            "by": self.by,
            "policy_hash": self.policy_hash,
            "previous_hash": self.previous_hash,
            "result": self.result,
            "errors": list(self.errors),
            "ledger_seq": self.ledger_seq,
        }


def _stamps(directory: Path) -> tuple[tuple[str, int, int], ...]:
    """Cheap change detector: (path, size, mtime_ns) of every file; the hash is computed only on change."""
    out = []
    for p in policy_files(directory):  # the files the hash covers, so a change to any of them is seen
        st = p.stat()
        out.append((p.relative_to(directory).as_posix(), st.st_size, st.st_mtime_ns))
    return tuple(out)


@dataclass
class PolicyReloader:
    """Owns reloads of one gateway's policy set. Thread-safe (serialised by gw.policy_lock)."""

    gw: PolicyHolder
    loaded_at: datetime | None = None
    history: deque[LoadAttempt] = field(default_factory=lambda: deque(maxlen=HISTORY))
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _seen_stamps: tuple[tuple[str, int, int], ...] = ()
    _settling_stamps: tuple[tuple[str, int, int], ...] | None = None
    _refused_hash: str | None = None
    _adopt_failed: tuple[str, tuple[tuple[str, int, int], ...], str] | None = None  # (named, stamps, why)

    @property
    def directory(self) -> Path:
        return Path(self.gw.settings.policies_dir)

    # -- start-up ------------------------------------------------------------------------------

    def record_startup(self) -> LoadAttempt:
        """Ledger the set the gateway started with and make it the set in force for every replica. Raises
        PolicyRefused never: a start-up set was already loaded by open_gateway; a ledger failure here is logged,
        not fatal. Raises a database error when the set cannot be named (replicas): start-up fails then."""
        with self.gw.policy_lock:
            self._seen_stamps = _stamps(self.directory)
            attempt = self._record("startup", "system", self.gw.policy.policy_hash, "loaded", [], None)
            self._publish(self.gw.policy.policy_hash)
            self.loaded_at = attempt.at
            return attempt

    def _publish(self, policy_hash: str) -> None:
        """Name the set as the one in force (replicas; nothing on SQLite)."""
        sync = self.gw.policy_sync
        if sync.enabled:
            with self.gw.transaction() as session:
                sync.publish_set(session, policy_hash, str(self.directory), self.gw.clock())

    def adopt(self, named: str) -> None:
        """Load the set another replica made the one in force, from this replica's own files: tested and ledgered
        like any load (trigger `replica`). Raises PolicyOutOfStep while the files here are another set or do not
        load; files already found wanting are not loaded again until they change."""
        with self.gw.policy_lock:
            if self.gw.policy.policy_hash == named:
                return  # another thread adopted it, or this replica's own reload is what named it
            stamps = _stamps(self.directory)
            if self._adopt_failed is not None and self._adopt_failed[:2] == (named, stamps):
                raise PolicyOutOfStep(self._adopt_failed[2])
            why = f"the policy set in force is {named[:12]} (loaded by another replica)"
            try:
                self.reload(trigger="replica", by="system", expect=named)
            except PolicyRefused as e:
                self._adopt_failed = (named, stamps, f"{why}; this replica cannot load it from {self.directory}:"
                                                     f" {e.detail}")
                raise PolicyOutOfStep(self._adopt_failed[2]) from e
            if self.gw.policy.policy_hash != named:
                have = self.gw.policy.policy_hash
                self._adopt_failed = (named, stamps, f"{why}; this replica's files at {self.directory} are set"
                                                     f" {have[:12]}, so it decides nothing until they match")
                raise PolicyOutOfStep(self._adopt_failed[2])
            self._adopt_failed = None

    def on_signal(self, named: object) -> None:
        """Another replica loaded `named` (a signal): load it now rather than at this replica's next decision. In a
        thread of its own: a load runs the set's test suite, and the signals behind it (a token revoked) must not
        wait for that."""
        if not isinstance(named, str):
            return

        def adopt() -> None:
            try:
                self.adopt(named)
            except PolicyOutOfStep as e:
                log.error("policy set in force not loaded here: %s", e.detail)
            except Exception:
                log.exception("could not load the policy set %s another replica loaded", named[:12])

        threading.Thread(target=adopt, name="policy-adopt", daemon=True).start()

    # -- reload --------------------------------------------------------------------------------

    def reload(self, *, trigger: str, by: str, decision_seq: int | None = None,
               expect: str | None = None) -> LoadAttempt:
        """Load, test and activate the policy directory. Raises PolicyRefused (the old set stays).

        `decision_seq`, the allowed policy.reload decision of an API reload, is cited by the load's entry: it is
        that decision's outcome (gateway/decisions/reconcile.py). With `expect` (adopting the set another replica
        loaded), files of another set are refused without being loaded, and the set loaded is not named again."""
        cite = {} if decision_seq is None else {"decision_seq": decision_seq}
        with self.gw.policy_lock:
            self._seen_stamps = _stamps(self.directory)
            previous = self.gw.policy.policy_hash
            try:
                candidate_hash = policy_hash(self.directory)
            except OSError as e:
                candidate_hash = ""
                errors = [str(PolicyProblem(str(self.directory), 0, f"cannot read: {e}"))]
                return self._refuse(trigger, by, candidate_hash, errors, previous, cite)
            except PolicyLoadError as e:
                return self._refuse(trigger, by, "", [str(p) for p in e.errors], previous, cite)
            if expect is not None and candidate_hash != expect:
                return self._refuse(trigger, by, candidate_hash, [f"these files are set {candidate_hash[:12]}, not"
                                                                  f" the set in force {expect[:12]}"], previous, cite)
            if candidate_hash == previous:
                # (and the set in force: a replica out of step refuses the reload's own decision first)
                return self._record(trigger, by, candidate_hash, "unchanged", [], previous, cite)
            try:
                policy_set = load_tested_set(self.directory)
                with self.gw.transaction() as session:
                    bindings = load_bindings(session)
            except PolicyLoadError as e:
                return self._refuse(trigger, by, candidate_hash, [str(p) for p in e.errors], previous, cite)
            except PolicyError as e:
                return self._refuse(trigger, by, candidate_hash, [e.diagnostics()], previous, cite)
            try:
                engine = make_engine(policy_set, bindings, kind=self.gw.settings.policy_engine,
                                     opa_url=self.gw.settings.opa_url, opa_timeout_s=self.gw.settings.opa_timeout_s)
            except PolicyError as e:
                errors = [str(p) for p in e.errors] if isinstance(e, PolicyLoadError) else [e.diagnostics()]
                return self._refuse(trigger, by, candidate_hash, errors + self._push_back(), previous, cite)
            # Record first: the load is durable in the ledger before the new set decides anything.
            try:
                attempt = self._record(trigger, by, policy_set.hash, "loaded", [], previous, cite, strict=True)
            except LedgerError as e:
                engine.close()
                self._push_back()
                raise PolicyRefused(f"the load could not be recorded in the ledger ({e}); the previous set stays",
                                    errors=[], policy_hash=candidate_hash, active_hash=previous) from e
            if expect is None:
                try:  # named before it decides here: a decision meanwhile waits for the lock (PolicySync.adopt)
                    self._publish(policy_set.hash)
                except Exception as e:
                    engine.close()
                    self._push_back()
                    raise PolicyRefused(f"the set could not be named in the business database ({e}); the previous"
                                        " set stays", errors=[], policy_hash=candidate_hash,
                                        active_hash=previous) from e
            old = self.gw.policy
            self.gw.policy_set = policy_set
            self.gw.policy = engine
            if self.gw.limiter is not None:  # H2: the calls-per-minute numbers are policy data too
                self.gw.limiter.configure(policy_set.data.get("limits", {}))
            old.close()
            self.loaded_at = attempt.at
            self._refused_hash = None
            log.info("policy set %s loaded (%s by %s)", policy_set.hash[:12], trigger, by)
            return attempt

    def _push_back(self) -> list[str]:
        """Put the active set back where it is evaluated after a candidate was pushed there (OPA): a push that
        failed part-way leaves the server answering under no set's hash, and the active engine fails closed
        until this succeeds. Returns the problem if it did not, for the refusal to report."""
        try:
            self.gw.policy.push()
        except PolicyError as e:
            log.error("could not push the active policy set back: %s", e.diagnostics())
            return [f"the active set could not be pushed back, so decisions fail closed until a reload succeeds:"
                    f" {e}"]
        return []

    def _refuse(self, trigger: str, by: str, candidate: str, errors: list[str], previous: str,
                cite: dict[str, int]) -> LoadAttempt:
        attempt = self._record(trigger, by, candidate, "refused", errors, previous, cite)
        self._refused_hash = candidate
        log.warning("policy set %s refused (%s by %s): %s", candidate[:12], trigger, by, "; ".join(errors))
        raise PolicyRefused(
            f"policy set {candidate[:12]} refused with {len(errors)} error(s); {previous[:12]} stays active: "
            + "; ".join(errors[:5]),
            errors=errors,
            policy_hash=candidate,
            active_hash=previous,
            ledger_seq=attempt.ledger_seq,
        )

    def _record(self, trigger: str, by: str, candidate: str, result: str, errors: list[str],
                previous: str | None, cite: dict[str, int] | None = None, *, strict: bool = False) -> LoadAttempt:
        """Append a `policy` ledger entry; with strict, a ledger failure raises LedgerError."""
        now = self.gw.clock()
        body = {"event": "policy.load", "trigger": trigger, "by": by, "result": result, "policy_hash": candidate,
                "previous_hash": previous, "errors": errors, "directory": str(self.directory),
                "engine": self.gw.settings.policy_engine, **(cite or {})}
        seq: int | None = None
        try:
            seq = self.gw.ledger.append("policy", body).seq
        except LedgerError:
            if strict:
                raise
            log.exception("could not record the policy load in the ledger")
        attempt = LoadAttempt(now, trigger, by, candidate, result, tuple(errors), seq, previous)
        self.history.append(attempt)
        return attempt

    # -- watcher -------------------------------------------------------------------------------

    def poll_once(self) -> LoadAttempt | None:
        """Reload if the directory changed, then stayed as it is for one more look, and is not a set already
        refused.

        1. Unchanged since the last load or look: nothing to do.
        2. Changed since the last look: wait one more. A reviewer's edit of several files (a `git pull`, a copy
           of a reviewed directory, an editor saving all) lands file by file; a look in the middle found a set
           no one wrote, which loaded when it compiled and passed its tests (a matrix row saved before the guard
           that narrows it).
        3. The same as at the last look: the edit has settled; reload.
        """
        stamps = _stamps(self.directory)
        if stamps == self._seen_stamps:
            self._settling_stamps = None
            return None
        if stamps != self._settling_stamps:
            self._settling_stamps = stamps
            return None
        self._settling_stamps = None
        self._seen_stamps = stamps
        try:
            candidate = policy_hash(self.directory)
        except PolicyLoadError:
            candidate = ""  # a file that cannot be read: the reload below refuses the set and ledgers why
        if candidate in (self.gw.policy.policy_hash, self._refused_hash):
            return None
        try:
            return self.reload(trigger="watch", by="system")
        except PolicyRefused:
            return self.history[-1] if self.history else None

    def start(self, interval_s: float) -> None:
        """Poll in a daemon thread every interval_s (0 disables watching)."""
        if interval_s <= 0 or self._thread is not None:
            return

        def run() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.poll_once()
                except Exception:  # the watcher must outlive a bad file system moment
                    log.exception("policy watcher")

        self._thread = threading.Thread(target=run, name="policy-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def status(self) -> dict[str, Any]:
        """What GET /v1/policy shows."""
        ps = self.gw.policy_set
        return {
            "policy_hash": self.gw.policy.policy_hash,
            "directory": str(ps.directory),
            "engine": self.gw.settings.policy_engine,
            "loaded_at": self.loaded_at.isoformat() if self.loaded_at else None,
            "files": sorted([*ps.rego_modules, "model.conf", "matrix.csv", "data.json"]),
            "watch_interval_s": self.gw.settings.policy_watch_interval_s,
            "history": [a.to_json() for a in reversed(self.history)],
        }
