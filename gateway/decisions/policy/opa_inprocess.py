"""OPA's own evaluator in-process as the policy engine (`--policy-engine opa-inprocess`).

OPA v1.20.2's Go engine (github.com/open-policy-agent/opa/v1/rego) compiled as a shared library and loaded with
ctypes: the package opa-golib-python-bindings (import name opa_bindings). It declares Python >= 3.14 but loads on
3.11, so it is installed apart from the package's dependencies with the pin in OPA_GOLIB_PIN (`make venv` does).

Casbin and the role bindings stay gateway-side exactly as in EmbeddedEngine (inherited); only the Rego is
evaluated by OPA. Each Rego file is added under its own name, so OPA's compile errors name file:line as the
loader's do. The library evaluates with OPA's strict builtin errors: a builtin called with a value it cannot
take fails the decision (closed), as the OPA server engine asks for too (gateway.decisions.policy.opa).

One library engine evaluates one query at a time (it holds a lock around each), so, as with InterpreterPool,
each decision in progress leases a compiled copy of its own; the ctypes call gives up the GIL while OPA
evaluates, so copies run in parallel. The inherited regopy interpreter is compiled too but never asked for
decisions; it keeps `jobgate policy explain` and the set's checks local.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from gateway.decisions.policy.engine import EmbeddedEngine, PolicyUnavailable, RoleBinding
from gateway.decisions.policy.errors import PolicyLoadError, PolicyProblem
from gateway.decisions.policy.loader import DECISION_ENTRYPOINT, PolicySet

log = logging.getLogger(__name__)

OPA_GOLIB_PIN = "opa-golib-python-bindings==0.4.4"  # OPA v1.20.2; the Makefile installs the same pin
DOCUMENT = DECISION_ENTRYPOINT.replace("/", ".")
# "authz.rego:12: rego_unsafe_var_error: var y is unsafe", as the library reports OPA's errors.
_LOCATED = re.compile(r"(?P<file>[^\s:]+):(?P<line>\d+): (?P<message>(?:rego|eval)_\w+: [^\n]*)")


def opa_problems(source: str, message: str) -> list[PolicyProblem]:
    """OPA's errors in a library message as file:line problems (one problem naming `source` if none is located)."""
    found = [PolicyProblem(m["file"], int(m["line"]), f"OPA: {m['message']}") for m in _LOCATED.finditer(message)]
    return found or [PolicyProblem(source, 0, f"OPA: {message}")]


def _library() -> Any:
    """The opa_bindings module. Raises PolicyLoadError when it is not installed or its library does not load."""
    try:
        import opa_bindings
    except (ImportError, OSError) as e:
        raise PolicyLoadError([PolicyProblem("opa-inprocess", 0, (
            f"policy engine opa-inprocess needs OPA's library: pip install --ignore-requires-python {OPA_GOLIB_PIN}"
            f" ({type(e).__name__}: {e})"))]) from e
    return opa_bindings


class OpaCopies:
    """Compiled library engines of one policy set, one per evaluation in progress (see the module doc)."""

    def __init__(self, policy_set: PolicySet) -> None:
        """Compiles the first copy now. Raises PolicyLoadError if OPA refuses the set or is not installed."""
        self._lib = _library()
        self._policy_set = policy_set
        self._free = [self._compile()]

    def _compile(self) -> Any:
        lib = self._lib
        engine = lib.OpaEngine()
        engine.print_handler = _log_print
        try:
            for name, source in sorted(self._policy_set.rego_modules.items()):
                engine.add_policy(name, source)
            engine.add_data(self._policy_set.data)
            engine.eval_document(DOCUMENT, {})  # compiles every module and prepares the decision query
        except lib.OpaUndefinedError as e:
            engine.close()
            raise PolicyLoadError([PolicyProblem("authz.rego", 0, "OPA finds no `decision` for an empty input")]) from e
        except lib.OpaError as e:
            engine.close()
            raise PolicyLoadError(opa_problems("authz.rego", e.message)) from e
        return engine

    @contextmanager
    def lease(self) -> Iterator[Any]:
        try:
            engine = self._free.pop()  # atomic: list.pop holds the GIL throughout
        except IndexError:
            engine = self._compile()
        try:
            yield engine
        finally:
            self._free.append(engine)

    def close(self) -> None:
        while self._free:
            self._free.pop().close()


class OpaInProcessEngine(EmbeddedEngine):
    """Casbin in-process (inherited), Rego evaluated by OPA's Go engine in this process. Thread-safe."""

    def __init__(self, policy_set: PolicySet, bindings: Iterable[RoleBinding]) -> None:
        """Raises PolicyLoadError if OPA refuses the set or its library is not installed."""
        super().__init__(policy_set, bindings)
        self._opa = OpaCopies(policy_set)

    def evaluate(self, doc: Mapping[str, Any]) -> Any:
        """The raw value of data.jobgate.authz.decision, evaluated by OPA.

        Raises PolicyUnavailable when it is undefined, evaluation fails (a builtin error too), or the input cannot
        be passed as JSON.
        """
        lib = self._opa._lib
        with self._opa.lease() as opa:
            try:
                return opa.eval_document(DOCUMENT, doc)
            except lib.OpaUndefinedError as e:
                raise PolicyUnavailable("the policy defines no decision for this input") from e
            except lib.OpaError as e:
                raise PolicyUnavailable(f"evaluation error: {e}") from e
            except (TypeError, ValueError) as e:  # json.dumps of the input
                raise PolicyUnavailable(f"the input is not JSON: {e}") from e

    def close(self) -> None:
        """Release the compiled copies (each holds an OPA engine in the library)."""
        self._opa.close()


def _log_print(message: str, location: str) -> None:
    # A reviewer's print() in a rule: to the log, never to the gateway's stderr once per decision.
    log.debug("rego print at %s: %s", location, message)
