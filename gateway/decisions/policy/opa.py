"""An OPA server as the policy engine, through opa-python-client (DESIGN "Policies": selectable engine).

The gateway keeps role bindings and Casbin beside the engine, exactly as EmbeddedEngine does: it puts
`granted` and `actor.roles` into the input, then asks OPA for `data.jobgate.authz.decision`. On start
and on every reload it pushes the policy set (OPA's REST API: PUT /v1/policies/{id}) and data.json
(PUT /v1/data/{key}), so the server never needs the policy directory.

Modules of one Rego package are pushed as one module: OPA compiles on every PUT, and a module that
refers to rules of a sibling file not pushed yet would be refused. Each file's text is kept, marked by a
`# --- file: NAME ---` line.

A push is not atomic on the server: while it runs, and after one that failed part-way, the server holds
pieces of two sets. So every decision is asked of a small module of the gateway's own (ANSWER_ID) that gives
the decision together with the hash of the set it was pushed with, in one evaluation; the engine accepts only
an answer under its own hash. A push first marks the server as changing (no decision, no hash) and writes the
hash last, so a decision taken mid-push or after a failed push is a fail-closed deny, never a decision of a
mixture recorded under either set's hash. A reload that fails pushes the previous set back.

Decisions are asked with OPA's strict builtin errors (`?strict-builtin-errors=true`): a builtin called with a
value it cannot take (trim_space(null)) fails the decision instead of leaving that expression undefined, where a
deny rule could silently not fire. That is also how OPA's evaluator decides in-process
(gateway.decisions.policy.opa_inprocess) and in the test server (tests/gateway/decisions/policy/opa_server.py), so
the three answer alike.

Fail closed: an unreachable server, a timeout, an error or an undefined decision is a deny with rule
`fail_closed` and reason "policy unavailable: ...", recorded in the ledger like any decision.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

import requests
from opa_client.errors import ConnectionsError, DeletePolicyError, QueryExecuteError, RegoParseError, TypeException
from opa_client.opa import OpaClient

from gateway.decisions.policy.engine import EmbeddedEngine, PolicyUnavailable, RoleBinding
from gateway.decisions.policy.errors import PolicyLoadError, PolicyProblem
from gateway.decisions.policy.loader import DECISION_ENTRYPOINT, PolicySet

POLICY_PREFIX = "jobgate/"
DEFAULT_TIMEOUT_S = 1.0
# The gateway's own module, outside POLICY_PREFIX so that dropping stale modules never drops it.
ANSWER_ID = "jobgate-gateway/answer"
ANSWER_ENTRYPOINT = "jobgate_gateway/answer"
CHANGING = "changing"
# A builtin error fails the decision (closed) rather than making its expression undefined: see the module doc.
STRICT = {"strict-builtin-errors": True}

_PACKAGE = re.compile(r"^package\s+([\w.]+)\s*$", re.MULTILINE)
_IMPORT = re.compile(r"^import\s+[^\n]+$", re.MULTILINE)

# Every failure of the client or its transport, mapped once here (STYLE: map errors at the boundary).
_CLIENT_ERRORS: tuple[type[BaseException], ...] = (
    requests.RequestException,
    ConnectionsError,
    DeletePolicyError,
    QueryExecuteError,
    RegoParseError,
    TypeException,
    ValueError,
    KeyError,
)


def answer_module(policy_hash: str | None) -> str:
    """The gateway's module: the decision beside the hash of the set pushed with it; without a hash (a push
    under way) it holds no decision, so nothing is decided until the whole set is on the server."""
    if policy_hash is None:
        return f'package jobgate_gateway\n\nanswer := {{"policy_hash": "{CHANGING}"}}\n'
    return (f'package jobgate_gateway\n\nanswer := {{"policy_hash": "{policy_hash}",'
            f' "decision": data.{DECISION_ENTRYPOINT.replace("/", ".")}}}\n')


def opa_said(response: requests.Response | None) -> str:
    """An error answer in OPA's words: its status, code and first error ("500 internal_error: ... trim_space:
    operand 1 must be string but got null"), so a fail-closed deny in the ledger says what OPA refused."""
    if response is None:
        return "no answer"
    try:
        body = response.json()
    except ValueError:
        return f"{response.status_code} {response.text[:200]}"
    if not isinstance(body, dict):
        return f"{response.status_code} {str(body)[:200]}"
    said = f"{response.status_code} {body.get('code')}: {body.get('message')}"
    errors = body.get("errors")
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        first = errors[0]
        where = first.get("location") if isinstance(first.get("location"), dict) else {}
        at = f"{where.get('file')}:{where.get('row')}: " if where else ""
        said += f" ({at}{first.get('code')}: {first.get('message')})"
    return said[:500]


def bundle_modules(modules: Mapping[str, str]) -> dict[str, str]:
    """Group Rego modules by package into one module each: {"jobgate/<package path>": source}.

    Raises PolicyLoadError for a module without a package line.
    """
    grouped: dict[str, tuple[list[str], list[str]]] = {}
    for name, source in sorted(modules.items()):
        match = _PACKAGE.search(source)
        if match is None:
            raise PolicyLoadError([PolicyProblem(name, 1, "no package line")])
        imports, bodies = grouped.setdefault(match.group(1), ([], []))
        for line in _IMPORT.findall(source):
            if line.strip() not in imports:
                imports.append(line.strip())
        body = _IMPORT.sub("", _PACKAGE.sub("", source, count=1))
        bodies.append(f"# --- file: {name} ---\n{body.strip()}\n")
    return {
        POLICY_PREFIX + package.replace(".", "/"): "\n".join([f"package {package}", "", *imports, "", *bodies])
        for package, (imports, bodies) in grouped.items()
    }


class OpaEngine(EmbeddedEngine):
    """Casbin in-process (inherited), Rego on an OPA server. Thread-safe.

    The inherited in-process interpreter is compiled too but never asked for decisions; it costs one
    compile per load and keeps `jobgate policy explain` and the engine's checks local.
    """

    def __init__(
        self,
        policy_set: PolicySet,
        bindings: Iterable[RoleBinding],
        *,
        url: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Connect and push the policy set. Raises PolicyLoadError if the server refuses it or is unreachable."""
        super().__init__(policy_set, bindings)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PolicyLoadError([PolicyProblem("opa", 0, f"bad OPA URL {url!r}; expected http://host:port")])
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        # retries=0: a decision must fail closed within the timeout, not after a back-off series.
        self._client = OpaClient(
            host=parts.hostname,
            port=parts.port or (443 if parts.scheme == "https" else 80),
            ssl=parts.scheme == "https",
            timeout=timeout_s,
            retries=0,
        )
        try:
            self.push()
        except PolicyLoadError:
            self._client.close_connection()
            raise

    def push(self) -> None:
        """Put the policy modules and data.json on the server; drop our modules it no longer has.

        1. Mark the server as changing: from here on no engine gets an answer under its hash.
        2. The modules, then drop stale ones, then the data.
        3. Last, the answer module with this set's hash: only now does this engine get decisions.
        Raises PolicyLoadError naming the step that failed (the server stays marked as changing).
        """
        wanted = bundle_modules(self.policy_set.rego_modules)
        try:
            self._client.update_policy_from_string(answer_module(None), ANSWER_ID, rego_compat=False)
            for policy_id, source in wanted.items():
                self._client.update_policy_from_string(source, policy_id, rego_compat=False)
            for policy_id in self._client.get_policies_list():
                if policy_id.startswith(POLICY_PREFIX) and policy_id not in wanted:
                    self._client.delete_policy(policy_id)
            for key, value in self.policy_set.data.items():
                self._put_data(key, value)
            self._client.update_policy_from_string(answer_module(self.policy_hash), ANSWER_ID, rego_compat=False)
        except _CLIENT_ERRORS as e:
            unreachable = isinstance(e, requests.ConnectionError | ConnectionsError)
            said = "could not be reached" if unreachable else "refused the set"
            problem = PolicyProblem("opa", 0, f"the OPA server at {self.url} {said}: {e}")
            raise PolicyLoadError([problem]) from e

    def _put_data(self, key: str, value: Any) -> None:
        if isinstance(value, dict):
            self._client.update_or_create_data(value, key)
            return
        # The client only takes objects; a top-level number (e.g. external_rights_extra_approvals) goes
        # through the same session with the same documented call: PUT /v1/data/{path}.
        response = self._client._session.put(f"{self._client.root_url}/data/{key}", json=value, timeout=self.timeout_s)
        if response.status_code != 204:
            raise ValueError(f"PUT /v1/data/{key} answered {response.status_code}: {response.text[:200]}")

    def evaluate(self, doc: Mapping[str, Any]) -> Any:
        """POST /v1/data/jobgate_gateway/answer?strict-builtin-errors=true {"input": doc} → the decision, if given
        under this set's hash.

        Raises PolicyUnavailable on any transport or server error, a timeout, an undefined decision, or an
        answer under another set's hash (a push under way, or one that failed part-way).
        """
        try:
            body = self._client.query_rule(dict(doc), ANSWER_ENTRYPOINT, query_params=STRICT)
        except requests.Timeout as e:
            raise PolicyUnavailable(f"the OPA server at {self.url} did not answer within {self.timeout_s} s") from e
        except requests.HTTPError as e:
            raise PolicyUnavailable(f"the OPA server at {self.url} failed: {opa_said(e.response)}") from e
        except _CLIENT_ERRORS as e:
            raise PolicyUnavailable(f"the OPA server at {self.url} failed: {type(e).__name__}: {e}") from e
        answer = body.get("result") if isinstance(body, dict) else None
        if not isinstance(answer, dict):
            raise PolicyUnavailable("the policy defines no decision for this input")
        if answer.get("policy_hash") != self.policy_hash:
            held = str(answer.get("policy_hash"))[:12]
            raise PolicyUnavailable(f"the OPA server at {self.url} holds policy set {held}, not {self.policy_hash[:12]}"
                                    " (a reload is under way or failed part-way)")
        if "decision" not in answer:
            raise PolicyUnavailable("the policy defines no decision for this input")
        return answer["decision"]

    def close(self) -> None:
        """Close the HTTP session."""
        self._client.close_connection()
