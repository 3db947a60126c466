"""Load and check a policy directory: Casbin model + matrix, Rego modules, tunable data.

A policy set is refused as a whole, with every problem as `file:line: message`, so a security
reviewer's typo never half-applies (DESIGN "Policies": the last good set stays active).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from casbin.model import Model
from regopy import Bundle, Input, Interpreter, LogLevel, Output, RegoError

from gateway.decisions.policy.errors import PolicyLoadError, PolicyProblem

MODEL_FILE = "model.conf"
MATRIX_FILE = "matrix.csv"
DATA_FILE = "data.json"
# Rego test modules live under tests/ and are never part of the decision bundle.
TESTS_DIR = "tests"

PACKAGE_PATH = "jobgate/authz"
DECISION_ENTRYPOINT = "jobgate/authz/decision"

# The capabilities the Rego rules know; a matrix row naming anything else is a typo that would
# silently grant nothing, so it is refused at load.
CAPABILITIES = frozenset(
    {
        "job.view",
        "job.submit",
        "job.submit.urgent",
        "job.stop.own",
        "job.stop.any",
        "job.stop.service",
        "job.priority.own",
        "job.priority.any",
        "job.pause.own",
        "job.pause.any",
        "job.delete.own",
        "quota.change",
        "role.manage",
        "policy.reload",
        "ledger.read",
        "approval.grant",
        "emergency.stop",
        "job.confirm_stopped",
        "breakglass.request",
    }
)

# data.json numbers the Rego rules read; each must be a positive integer.
REQUIRED_NUMBERS: tuple[tuple[str, ...], ...] = (
    ("limits", "jobs_per_batch"),
    ("limits", "projects_per_batch"),
    ("limits", "gpus_per_call"),
    ("approval", "expiry_seconds"),
    ("confirmations", "job"),
    ("confirmations", "workload"),
    ("confirmations", "scope"),
    ("external_rights_extra_approvals",),
    ("cross_project_extra_approvals",),
    ("stop", "grace_window_seconds"),
    ("breakglass", "max_seconds"),
    ("breakglass", "second_oncall_approvals"),
    # A count Rego cannot do arithmetic with drops the need for a second person instead of failing (a text
    # "1" let a workload-level emergency stop run on one person's word), and a ceiling it cannot compare
    # with never refuses: each is checked here.
    ("emergency", "max_targets"),
    ("emergency", "approvals", "job"),
    ("emergency", "approvals", "workload"),
    ("emergency", "approvals", "scope"),
)
# Numbers the gateway reads itself (the rate limiter, gateway/decisions/ratelimit.py), with defaults when absent; when
# present they are checked like the required ones, so a typo is refused at load instead of being loaded and
# then failing the next start-up.
OPTIONAL_NUMBERS: tuple[tuple[str, ...], ...] = (
    ("limits", "calls_per_minute_per_principal"),
    ("limits", "calls_per_minute_per_project"),
)

# Periods in whole days the gateway reads itself, with today's values as defaults when absent: the important
# tier's checkpoint retention (P1, gateway/jobs/retention.py) and the recovery window of a deleted job (A6,
# gateway/jobs/lifecycle.py). At least a day: zero keeps an important checkpoint less than a normal one, and leaves
# no time to undelete. At most a century, so that the date they give is on the calendar.
OPTIONAL_DAYS: tuple[tuple[str, ...], ...] = (
    ("retention", "important_days"),
    ("deletion", "recovery_window_days"),
)
MAX_DAYS = 36500

# Keys of data.json the gateway itself reads beside the numbers above (quotas.py: Q3 scores) or that only
# document the file.
GATEWAY_DATA_KEYS = frozenset({"contribution", "about", "isolation"})

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class MatrixRow:
    """One `p, role, project, capability` row with the line it came from."""

    role: str
    project: str
    capability: str
    line: int


@dataclass(frozen=True)
class PolicySet:
    """A checked, immutable policy directory; `hash` is recorded in every decision."""

    directory: Path
    hash: str
    model_text: str
    matrix_csv: str
    rego_modules: dict[str, str]
    data: dict[str, Any]
    matrix: tuple[MatrixRow, ...] = field(default=())


def load_policy_set(directory: Path) -> PolicySet:
    """Read, check and compile every policy file in `directory`.

    Raises PolicyLoadError listing every problem found (not only the first).
    """
    directory = Path(directory)
    problems: list[PolicyProblem] = []
    # One read of every file: the set is parsed from these bytes and hashed over them, so the hash names
    # exactly what decides even when a reviewer saves a file mid-load, and a module the hash leaves out (a
    # dot-file) is never loaded either.
    files = _read_files(directory, problems)
    problems.extend(_unreadable_modules(directory))
    model_text = _text(files, MODEL_FILE, problems)
    matrix_csv = _text(files, MATRIX_FILE, problems)
    data_text = _text(files, DATA_FILE, problems)
    rego_modules: dict[str, str] = {}
    for name in sorted(n for n in files if n.endswith(".rego") and "/" not in n):
        source = _text(files, name, problems)
        if source is not None:
            rego_modules[name] = source
    if not rego_modules and not any(p.file.endswith(".rego") for p in problems):
        problems.append(PolicyProblem("*.rego", 0, "no Rego module found"))

    model_problems = check_model(model_text) if model_text is not None else []
    problems.extend(model_problems)
    matrix: tuple[MatrixRow, ...] = ()
    if matrix_csv is not None:
        matrix, matrix_problems = parse_matrix(matrix_csv)
        problems.extend(matrix_problems)
        if model_text is not None and not model_problems and not matrix_problems:
            problems.extend(check_model_agrees(model_text, matrix))
    data: dict[str, Any] = {}
    if data_text is not None:
        data, data_problems = parse_data(data_text)
        problems.extend(data_problems)
    if rego_modules and not any(p.file == DATA_FILE for p in problems):
        problems.extend(unread_data_keys(data, data_text or "", rego_modules))
    if rego_modules and not any(p.file == DATA_FILE for p in problems):
        problems.extend(check_rego(rego_modules, data))
    if problems:
        raise PolicyLoadError(problems)
    return PolicySet(
        directory=directory,
        hash=hash_files(files),
        model_text=model_text or "",
        matrix_csv=matrix_csv or "",
        rego_modules=rego_modules,
        data=data,
        matrix=matrix,
    )


def policy_hash(directory: Path) -> str:
    """The hash of the set as it is on disk now (see hash_files). Raises PolicyLoadError naming a file that
    cannot be read."""
    problems: list[PolicyProblem] = []
    files = _read_files(directory, problems)
    if problems:
        raise PolicyLoadError(problems)
    return hash_files(files)


def hash_files(files: Mapping[str, bytes]) -> str:
    """SHA-256 over every file's relative path and bytes, in sorted path order.

    Each file contributes `path NUL length NUL bytes`, so no two different trees hash alike by
    moving bytes between a name and a body.
    """
    digest = hashlib.sha256()
    for name in sorted(files):
        body = files[name]
        digest.update(name.encode())
        digest.update(b"\0" + str(len(body)).encode() + b"\0")
        digest.update(body)
    return digest.hexdigest()


def policy_files(directory: Path) -> list[Path]:
    """Every file of the set, sorted: what the hash covers and the reload watcher stamps.

    Dot-files and `__pycache__` (an editor's swap file, a test run's bytecode) are left out by their path
    *inside* the set: judged on the absolute path, a set kept below a dot-directory (~/.config/...) had no
    files at all, so every version hashed alike and a reload of an edit answered "unchanged".
    """
    return sorted(
        p
        for p in directory.rglob("*")
        if p.is_file()
        and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(directory).parts)
    )


def _read_files(directory: Path, problems: list[PolicyProblem]) -> dict[str, bytes]:
    """The bytes of every file of the set (policy_files), by path relative to it; a file that cannot be read
    is a problem naming it."""
    files: dict[str, bytes] = {}
    for path in policy_files(directory):
        name = path.relative_to(directory).as_posix()
        try:
            files[name] = path.read_bytes()
        except OSError as e:
            problems.append(PolicyProblem(name, 0, f"cannot read: {e.strerror or e}"))
    return files


def _unreadable_modules(directory: Path) -> list[PolicyProblem]:
    """A module name that is no regular file (a directory called extra.rego, a dangling link) is refused by its
    name rather than skipped: the reviewer meant it to decide."""
    problems = []
    for path in sorted(directory.glob("*.rego")):
        if path.name.startswith(".") or path.is_file():
            continue
        try:
            path.read_bytes()
            why = "not a regular file"
        except OSError as e:
            why = str(e.strerror or e)
        problems.append(PolicyProblem(path.name, 0, f"cannot read: {why}"))
    return problems


def _text(files: Mapping[str, bytes], name: str, problems: list[PolicyProblem]) -> str | None:
    if name not in files:
        if not any(p.file == name for p in problems):  # not already reported as unreadable
            problems.append(PolicyProblem(name, 0, "missing from the policy directory"))
        return None
    try:
        return decode_policy_text(files[name], name)
    except PolicyLoadError as e:
        problems.extend(e.errors)
        return None


def read_policy_text(path: Path, name: str) -> str:
    """A policy file's text, UTF-8. Raises PolicyLoadError naming `name` (and the line of a byte that is not
    UTF-8): a file that cannot be read refuses the set like any other problem, never as a crash."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise PolicyLoadError([PolicyProblem(name, 0, f"cannot read: {e.strerror or e}")]) from e
    return decode_policy_text(raw, name)


def decode_policy_text(raw: bytes, name: str) -> str:
    """`raw` as UTF-8 text. Raises PolicyLoadError naming `name` and the line of the first byte that is not."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise PolicyLoadError([PolicyProblem(name, line, f"not UTF-8 text: {e.reason} at byte {e.start}")]) from e


def check_model(text: str) -> list[PolicyProblem]:
    """The Casbin model must parse and define r, p, g, e and m."""
    model = Model()
    try:
        model.load_model_from_text(text)
    except Exception as e:  # casbin raises bare Exceptions and RuntimeErrors for bad models
        return [PolicyProblem(MODEL_FILE, 0, f"Casbin cannot parse the model: {e}")]
    problems = []
    sections: dict[str, Any] = model.model
    for key in ("r", "p", "g", "e", "m"):
        if key not in sections or key not in sections[key]:
            problems.append(PolicyProblem(MODEL_FILE, 0, f"missing definition {key!r}"))
    return problems


def index_grants(matrix: tuple[MatrixRow, ...], role: str, bound_in: str, project: str) -> frozenset[str]:
    """The capabilities the gateway's index (EmbeddedEngine.capabilities) gives a role bound in `bound_in`
    ("*": globally) when asked about `project`: the role counts in its own project and, bound globally, in
    every one; it grants its rows for that project and its "*" rows."""
    if bound_in not in (project, "*"):
        return frozenset()
    return frozenset(r.capability for r in matrix if r.role == role and r.project in (project, "*"))


def check_model_agrees(text: str, matrix: tuple[MatrixRow, ...]) -> list[PolicyProblem]:
    """See _model_disagreement (cached: a thousand Casbin queries take about half a second, and the same set is
    loaded again by every explain, what-if and test in one process)."""
    return list(_model_disagreement(text, matrix))


@functools.lru_cache(maxsize=8)
def _model_disagreement(text: str, matrix: tuple[MatrixRow, ...]) -> tuple[PolicyProblem, ...]:
    """The Casbin model must answer as the gateway's index does, for every role of the matrix bound in a
    project and globally, asked about that project, another one, "*" and each project the matrix names.

    Decisions never run the model's matcher (an index of the matrix answers, for speed), so a model edited to
    grant less, such as `&& r.dom != "speech"`, was accepted and then ignored: the access it took away stayed.
    A model that does not agree is refused with the first disagreement."""
    import casbin

    model = Model()
    model.load_model_from_text(text)
    enforcer = casbin.Enforcer(model)
    enforcer.add_policies([[r.role, r.project, r.capability] for r in matrix])
    here, elsewhere = "probe-project", "probe-other-project"
    # Names the model itself spells out (`r.dom != "speech"`) are asked about too.
    spelt = {name for name in re.findall(r'"([^"\s]+)"', text) if _NAME.match(name)}
    projects = sorted({here, elsewhere, "*", *(r.project for r in matrix), *spelt})
    roles = sorted({r.role for r in matrix})
    enforcer.add_grouping_policies([[f"{role}@{bound}", role, bound] for role in roles for bound in (here, "*")])
    line = _model_line(text, "m")
    for role in roles:
        for bound in (here, "*"):
            for project in projects:
                granted = index_grants(matrix, role, bound, project)
                for capability in sorted(CAPABILITIES):
                    said = bool(enforcer.enforce(f"{role}@{bound}", project, capability))
                    if said != (capability in granted):
                        where = "globally" if bound == "*" else "in its project"
                        asked = "any project" if project == "*" else (
                            "its project" if project == here else "another project" if project == elsewhere
                            else f"project {project!r}")
                        return (PolicyProblem(MODEL_FILE, line,
                                              f"the model {'grants' if said else 'refuses'} {capability} to {role}"
                                              f" bound {where}, in {asked}, where the gateway's index of the matrix"
                                              f" {'refuses' if said else 'grants'} it; decisions use the index,"
                                              " so this model would be ignored: keep the shipped RBAC-with-domains"
                                              " matcher and change matrix.csv or the Rego guards instead"),)
    return ()


def _model_line(text: str, key: str) -> int:
    for number, raw in enumerate(text.splitlines(), start=1):
        if raw.strip().startswith(f"{key} ") or raw.strip().startswith(f"{key}="):
            return number
    return 0


def parse_matrix(text: str) -> tuple[tuple[MatrixRow, ...], list[PolicyProblem]]:
    """Parse `p, role, project, capability` rows; role bindings (g rows) belong in the DB, not here."""
    rows: list[MatrixRow] = []
    problems: list[PolicyProblem] = []
    seen: dict[tuple[str, str, str], int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if fields[0] != "p" or len(fields) != 4:
            problems.append(PolicyProblem(MATRIX_FILE, number, "expected `p, <role>, <project or *>, <capability>`"))
            continue
        _, role, project, capability = fields
        if not _NAME.match(role) or not (project == "*" or _NAME.match(project)):
            problems.append(PolicyProblem(MATRIX_FILE, number, f"bad role or project name in {line!r}"))
            continue
        if capability not in CAPABILITIES:
            problems.append(PolicyProblem(MATRIX_FILE, number, f"unknown capability {capability!r}"))
            continue
        key = (role, project, capability)
        if key in seen:
            problems.append(PolicyProblem(MATRIX_FILE, number, f"duplicate of line {seen[key]}"))
            continue
        seen[key] = number
        rows.append(MatrixRow(role, project, capability, number))
    if not rows and not problems:
        problems.append(PolicyProblem(MATRIX_FILE, 0, "the matrix grants nothing"))
    return tuple(rows), problems


def lookalike_roles(rows: tuple[MatrixRow, ...]) -> list[PolicyProblem]:
    """Roles whose name is nearly another's and that are granted less often than it: most likely a typo
    (`reseacher` beside `researcher`), which the set would accept as a new role anyone could then be bound to.
    Warnings, not refusals: two roles may be meant to look alike."""
    import difflib

    lines: dict[str, list[int]] = {}
    for row in rows:
        lines.setdefault(row.role, []).append(row.line)
    warnings = []
    for role, at in sorted(lines.items()):
        others = [r for r in lines if r != role and len(lines[r]) > len(at)]
        for near in difflib.get_close_matches(role, others, n=1, cutoff=0.8):
            warnings.append(PolicyProblem(MATRIX_FILE, at[0], f"role {role!r} ({len(at)} row(s)) looks like a"
                                                               f" misspelling of {near!r} ({len(lines[near])} rows)"))
    return warnings


def parse_data(text: str) -> tuple[dict[str, Any], list[PolicyProblem]]:
    """data.json must be an object holding every number the Rego rules read."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return {}, [PolicyProblem(DATA_FILE, e.lineno, e.msg)]
    if not isinstance(data, dict):
        return {}, [PolicyProblem(DATA_FILE, 1, "top level must be an object")]
    problems = []
    for path in (*REQUIRED_NUMBERS, *OPTIONAL_NUMBERS, *OPTIONAL_DAYS):
        value: Any = data
        present = True
        for key in path:
            present = present and isinstance(value, dict) and key in value
            value = value.get(key) if isinstance(value, dict) else None
        if not present and path not in REQUIRED_NUMBERS:
            continue
        if path in OPTIONAL_DAYS:
            low, high, need = 1, MAX_DAYS, f"a whole number of days from 1 to {MAX_DAYS}"
        else:
            low, high, need = 0, None, "a non-negative integer"
        # bool is an int subclass; `true` is never a valid limit.
        if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
            line = _line_of_key(text, path)
            problems.append(PolicyProblem(DATA_FILE, line, f"{'.'.join(path)} must be {need}"))
    problems.extend(_contribution_problems(data, text))
    problems.extend(_isolation_problems(data, text))
    return data, problems


def _isolation_problems(data: dict[str, Any], text: str) -> list[PolicyProblem]:
    """H1, read by the scheduler (gateway/native/scheduler_loop.py): which jobs may run on a node that cannot isolate
    them.
    `isolation.unisolated_nodes_take` = {"external_rights": bool, "projects": [project ids or "*"]}."""
    take = data.get("isolation", {}).get("unisolated_nodes_take") if isinstance(data.get("isolation"), dict) else None
    if "isolation" not in data:
        return []
    where = ("isolation", "unisolated_nodes_take")
    if not isinstance(take, dict) or set(take) - {"external_rights", "projects"}:
        return [PolicyProblem(DATA_FILE, _line_of_key(text, where), "isolation.unisolated_nodes_take must be an "
                              'object of "external_rights" (true/false) and "projects" (a list of project ids or "*")')]
    problems = []
    if not isinstance(take.get("external_rights", False), bool):
        problems.append(PolicyProblem(DATA_FILE, _line_of_key(text, (*where, "external_rights")),
                                      "isolation.unisolated_nodes_take.external_rights must be true or false"))
    projects = take.get("projects", ["*"])
    if not isinstance(projects, list) or not all(isinstance(p, str) for p in projects):
        problems.append(PolicyProblem(DATA_FILE, _line_of_key(text, (*where, "projects")),
                                      "isolation.unisolated_nodes_take.projects must be a list of project ids"))
    return problems


def _contribution_problems(data: dict[str, Any], text: str) -> list[PolicyProblem]:
    """Q3 scores (quotas.contribution_of) are numbers by user: a score written as text ("20") or `true` was
    read as 0, silently taking the user's standing away, and a `contribution` that is no object dropped
    everyone's."""
    if "contribution" not in data:
        return []
    scores = data["contribution"]
    if not isinstance(scores, dict):
        return [PolicyProblem(DATA_FILE, _line_of_key(text, ("contribution",)),
                              "contribution must be an object of scores by user")]
    return [PolicyProblem(DATA_FILE, _line_of_key(text, ("contribution", user)),
                          f"contribution.{user} must be a number")
            for user, score in scores.items()
            if not isinstance(score, int | float) or isinstance(score, bool)]


def unread_data_keys(data: dict[str, Any], text: str, rego_modules: dict[str, str]) -> list[PolicyProblem]:
    """Keys of data.json, at the top or inside a section the gateway reads (`limits`, `emergency.approvals`
    ...), that neither the gateway nor any Rego module reads: most likely misspelt. A misspelt optional
    number is otherwise dropped in silence and its default used: `calls_per_minute_per_principle: 2` left
    the limit at 60 while the reviewer meant to tighten it."""
    known = (*REQUIRED_NUMBERS, *OPTIONAL_NUMBERS, *OPTIONAL_DAYS)
    sections: dict[tuple[str, ...], set[str]] = {(): set(GATEWAY_DATA_KEYS)}
    for path in known:
        for depth in range(len(path)):
            sections.setdefault(path[:depth], set()).add(path[depth])
    rego = "\n".join(rego_modules.values())
    problems = []
    for section, keys in sorted(sections.items()):
        value: Any = data
        for key in section:
            value = value.get(key) if isinstance(value, dict) else None
        if not isinstance(value, dict):
            continue
        for key in value:
            if key in keys or re.search(rf"(?<![\w]){re.escape(key)}(?![\w])", rego):
                continue
            where = ".".join((*section, key))
            problems.append(PolicyProblem(DATA_FILE, _line_of_key(text, (*section, key)),
                                          f"{where} is read by neither the gateway nor any Rego module (misspelt?"
                                          f" known here: {', '.join(sorted(keys))})"))
    return problems


def _line_of_key(text: str, path: tuple[str, ...]) -> int:
    """The line of the last key of `path`, looked for after its parents' (`workload` is a key of
    `confirmations` and of `emergency.approvals`); 0 when it is not written."""
    index = 0
    for key in path:
        found = text.find(f'"{key}"', index)
        if found < 0:
            return 0
        index = found
    return text.count("\n", 0, index) + 1


def compile_rego(modules: dict[str, str], data: dict[str, Any],
                 entrypoints: list[str] | None = None) -> tuple[Interpreter, Bundle]:
    """Compile the decision bundle (or one with other entrypoints) once. Raises RegoError."""
    rego = Interpreter()
    # rego-cpp prints compile errors to stdout by default; they are reported through PolicyProblem.
    rego.log_level = LogLevel.NONE
    for name, source in modules.items():
        rego.add_module(name, source)
    rego.add_data(data)
    bundle = rego.build(None, entrypoints or [DECISION_ENTRYPOINT])
    return rego, bundle


def check_rego(modules: dict[str, str], data: dict[str, Any]) -> list[PolicyProblem]:
    """Compile; then the decision for an empty input must exist and be a deny (never fail open)."""
    try:
        rego, bundle = compile_rego(modules, data)
    except RegoError as e:
        return rego_problems(str(e), modules)
    if not bundle.ok():
        return [PolicyProblem(_first(modules), 0, "the Rego bundle did not build")]
    rego.set_input(Input({}))
    try:
        value = first_value(rego.query_bundle_entrypoint(bundle, DECISION_ENTRYPOINT))
    except (RegoError, ValueError) as e:
        return [PolicyProblem(_first(modules), 0, f"evaluating `decision` failed: {e}")]
    file, line = _locate_rule(modules, "decision")
    if not isinstance(value, dict):
        return [PolicyProblem(file, line, "package jobgate.authz must define rule `decision` with a default")]
    if value.get("effect") != "deny":
        return [PolicyProblem(file, line, "the default `decision` must be a deny (fail closed)")]
    return []


def first_value(output: Output) -> Any:
    """First expression of a regopy Output; None when undefined. Raises ValueError on an error."""
    if not output.ok():
        raise ValueError(str(output))
    if not output.results or not output.results[0].expressions:
        return None
    return output.results[0].expressions[0]


_ERROR = re.compile(r"\(error (\d+):")
_ERRORMSG = re.compile(r"\(errormsg (\d+):")
_ARROW = re.compile(r"-- ([^\s:]+\.rego):(\d+):(\d+)")


def rego_problems(text: str, modules: dict[str, str]) -> list[PolicyProblem]:
    """Turn a rego-cpp error sequence into file:line problems.

    rego-cpp reports `(error <len>:<file>|<byte offset>|<length> (errormsg <len>:<message>) ...)`;
    strings are length-prefixed, so they are sliced by length rather than matched by pattern.
    """
    problems: list[PolicyProblem] = []
    for match in _ERROR.finditer(text):
        start = match.end()
        name = text[start : start + int(match.group(1))]
        rest = text[start + len(name) :]
        location = re.match(r"\|(\d+)\|(\d+)", rest)
        msg_match = _ERRORMSG.search(rest)
        message = rest[msg_match.end() : msg_match.end() + int(msg_match.group(1))] if msg_match else "error"
        line = col = 0
        if location and name in modules:
            line, col = _line_col(modules[name], int(location.group(1)))
        problem = PolicyProblem(name or _first(modules), line, f"{message} (column {col})" if col else message)
        if problem not in problems:
            problems.append(problem)
    if not problems:
        for m in _ARROW.finditer(text):
            problems.append(PolicyProblem(m.group(1), int(m.group(2)), text.strip().splitlines()[0]))
    return problems or [PolicyProblem(_first(modules), 0, text.strip() or "Rego compile error")]


def _line_col(source: str, offset: int) -> tuple[int, int]:
    # rego-cpp offsets count bytes of the UTF-8 source.
    prefix = source.encode("utf-8")[:offset]
    line = prefix.count(b"\n") + 1
    col = len(prefix) - (prefix.rfind(b"\n") + 1) + 1
    return line, col


def _locate_rule(modules: dict[str, str], rule: str) -> tuple[str, int]:
    pattern = re.compile(rf"^(default\s+)?{rule}\b", re.MULTILINE)
    for name, source in modules.items():
        m = pattern.search(source)
        if m:
            return name, source.count("\n", 0, m.start()) + 1
    return _first(modules), 0


def _first(modules: dict[str, str]) -> str:
    return "authz.rego" if "authz.rego" in modules else next(iter(modules), "*.rego")
