"""An OPA server as the policy engine, through opa-python-client (DESIGN "Policies": selectable engine).

The gateway keeps role bindings and Casbin beside the engine, exactly as EmbeddedEngine does: it puts
`granted` and `actor.roles` into the input, then asks OPA for `data.jobgate.authz.decision`. On start
and on every reload it pushes the policy set (OPA's REST API: PUT /v1/policies/{id}) and data.json
(PUT /v1/data/{key}), so the server never needs the policy directory.

Modules of one Rego package are pushed as one module: OPA compiles on every PUT, and a module that
refers to rules of a sibling file not pushed yet would be refused. Each file's text is kept, marked by a
`# --- file: NAME ---` line. A push is not atomic on the server; the gateway refuses the reload if any
step fails and keeps using the set it had (which the next successful push replaces).

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

from gateway.policy.engine import EmbeddedEngine, PolicyUnavailable, RoleBinding
from gateway.policy.errors import PolicyLoadError, PolicyProblem
from gateway.policy.loader import DECISION_ENTRYPOINT, PolicySet

POLICY_PREFIX = "jobgate/"
DEFAULT_TIMEOUT_S = 1.0

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

        Raises PolicyLoadError naming the step that failed.
        """
        wanted = bundle_modules(self.policy_set.rego_modules)
        try:
            for policy_id, source in wanted.items():
                self._client.update_policy_from_string(source, policy_id, rego_compat=False)
            for policy_id in self._client.get_policies_list():
                if policy_id.startswith(POLICY_PREFIX) and policy_id not in wanted:
                    self._client.delete_policy(policy_id)
            for key, value in self.policy_set.data.items():
                self._put_data(key, value)
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
        """POST /v1/data/jobgate/authz/decision {"input": doc} → its "result".

        Raises PolicyUnavailable on any transport or server error, a timeout, or an undefined decision.
        """
        try:
            body = self._client.query_rule(dict(doc), DECISION_ENTRYPOINT)
        except requests.Timeout as e:
            raise PolicyUnavailable(f"the OPA server at {self.url} did not answer within {self.timeout_s} s") from e
        except _CLIENT_ERRORS as e:
            raise PolicyUnavailable(f"the OPA server at {self.url} failed: {type(e).__name__}: {e}") from e
        if not isinstance(body, dict) or "result" not in body:
            raise PolicyUnavailable("the policy defines no decision for this input")
        return body["result"]

    def close(self) -> None:
        """Close the HTTP session."""
        self._client.close_connection()
