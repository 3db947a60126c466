# Findings: one per subject of the request. A subject is a target job for job actions (each judged on
# its own, then combined in authz.rego), or the request's project for project-level actions.
# A finding is {"kind": "grant"|"deny", "rule", "reason", "subject", ...}; a grant also carries `base`
# (second persons the rule itself needs), `obligations`, and — when base > 0 — `eligible` (who may be
# that second person).
#
# Cost notes (rego-cpp 1.5 through regopy, measured with its statement trace, perf and paired timings;
# bench/policy.py). Every builtin call copies the evaluator's state, one slot per local of the whole
# compiled policy: about 5 µs early in a query and over 10 µs late, against well under one for an
# equality test or a step of an iteration. Builtin calls include `count`, every comparison but `==`,
# arithmetic, `in`, object.get, is_string and sprintf, and, inside a comprehension, `==` too. So hot
# paths test with `==` (`not x == y` over bound values for `x != y`), iterate for membership, look up
# with a fallback instead of object.get, and put a comprehension's tests in a function body.
# Testing a value for truth or comparing it serialises it, so a collection or an object is never tested:
# collections are iterated through a local (`ts := targets; some t in ts`), since `some t in targets`
# first tests the whole value against false. An object is built key by key, each insert comparing the
# keys already there, and every value put into an object, array or set is copied. A lookup walks an
# object's keys in order, about 0.6 µs a key (the input's keys come in regoio.HOT_KEYS order,
# data.json's in file order). Every call of a rule (cached within a query) or a function (not cached)
# pays a name lookup. So the rules below test the cheapest discriminating fact first, gate rarely true
# work behind one cached rule, and build few and small objects. rego-cpp also checks the whole compiled
# policy on every query, so its size costs too (about 20 ns per statement of the plan).
package jobgate.authz

import rego.v1

job_actions := {"job.stop", "job.priority", "job.pause", "job.delete"}

# Written as a lookup with a fallback rather than object.get (a builtin call, see the cost notes).
targets := ts if {
	ts := input.targets
} else := []

# How many jobs the request names, counted once per query (undefined, as count is, for null or a number).
target_count := count(targets)

# Whether the request names any job. `not n == 0` over a bound count is `n > 0` without a builtin call.
default has_targets := false

has_targets if {
	n := target_count
	not n == 0
}

actor := input.actor.id

# Read once per query (H1, F1 and R4 all ask).
actor_kind := input.actor.kind

# Project for project-level checks; "*" when the request names none (global actions such as reload).
request_project := p if {
	p := input.project
	is_string(p)
} else := "*"

# Capabilities the actor holds per project (computed by the engine from Casbin; global roles included).
# Looked up once per query, not once per call: a rule's value is cached, a function's is not.
granted := g if {
	g := input.granted
} else := {}

# Rules test `capability in granted[project]` inline: the same test, without a call.
holds(p, capability) if capability in granted[p]

verb := split(input.action, ".")[1]

# A2/A4/A5: the creator and the responsible owner both count as "own job".
# One definition with `else`: a function with several definitions is looked up once per definition.
owns(t) := true if {
	t.owner == actor
} else := true if {
	t.creator == actor
}

default reason_given := false

reason_given if {
	reason := trimmed_reason
	not reason == ""
}

# Undefined unless the reason is a string. The is_string test is not redundant: trim_space of null is an
# error, which OPA's strict builtin errors (the gateway asks for them) turn into a failed decision, where
# rego-cpp and a lenient OPA make it undefined. A rule of its own, not a line in reason_given: rego-cpp
# does not stop a body at an undefined builtin result (only at an undefined rule, call or lookup).
trimmed_reason := trim_space(r) if {
	r := input.reason
	is_string(r)
}

# Capability names used in sentences. They are looked up here rather than written as literals at the
# call sites because rego-cpp 1.x formats a string literal passed as a function argument with its
# quotes still on.
cap := {
	"view": "job.view",
	"stop_service": "job.stop.service",
	"delete_own": "job.delete.own",
}

# Where a capability is held, in words: "*" is not a project anyone named but the whole platform.
in_project(p) := sprintf("in project %s", [p]) if p != "*"

in_project("*") := platform_wide

platform_wide := "platform-wide"

missing_capability(p, capability) := sprintf("%s holds no role %s that grants %s", [actor, in_project(p), capability])

# A grant on a target job carries the job itself (approvals.rego reads its owner and flags); building
# it here once is much cheaper than merging the target into the finding afterwards.
# `eligible` is read only for a grant that itself needs a second person (base > 0, approvals.rego).
# Keys in the order they are read most (kind, then base): a lookup walks them in that order.
grant(rule, reason, t, base, eligible, obligations) := {
	"kind": "grant", "base": base, "rule": rule, "reason": reason, "subject": t.id, "target": t,
	"eligible": eligible, "obligations": obligations,
}

# A grant that needs no second person by its own rule (a notch may still ask for one, approvals.rego).
grant_alone(rule, reason, t, obligations) := {
	"kind": "grant", "base": 0, "rule": rule, "reason": reason, "subject": t.id, "target": t,
	"obligations": obligations,
}

# A grant on the request's project (project-level actions): no target.
project_grant(rule, reason, project, base, eligible, obligations) := {
	"kind": "grant", "base": base, "rule": rule, "reason": reason, "subject": project,
	"eligible": eligible, "obligations": obligations,
}

refuse(rule, reason, subject) := {"kind": "deny", "rule": rule, "reason": reason, "subject": subject}

nobody := {"roles": [], "principals": [], "projects": []}

# Default second person for another's job (A3, A4): its owner, a queue admin of its project, or on-call.
second_person(t) := {
	"roles": ["oncall", "queue_admin"],
	"principals": [p |
		some p in {t.owner}
		other_than_actor(p)
	],
	"projects": ["*", t.project],
}

# `p != actor` as a function (rego-cpp compiles a comparison inside a comprehension as a builtin call).
other_than_actor(p) if {
	me := actor
	not p == me
}

notify_owner(t) := {"kind": "notify_owner", "job": t.id, "owner": t.owner}

# Findings, in target order: one per target job for job actions (and for viewing named jobs, A1),
# otherwise one for the request's project. One array built in one pass, dispatched on the action
# here rather than through a multi-definition function (which costs a lookup per definition).
findings := [stop_finding(t) | some t in ts] if {
	input.action == "job.stop"
	has_targets
	ts := targets
} else := [view_finding(t) | some t in ts] if {
	input.action == "job.view"
	has_targets
	ts := targets
} else := [pause_finding(t) | some t in ts] if {
	input.action == "job.pause"
	has_targets
	ts := targets
} else := [priority_finding(t) | some t in ts] if {
	input.action == "job.priority"
	has_targets
	ts := targets
} else := [delete_finding(t) | some t in ts] if {
	input.action == "job.delete"
	has_targets
	ts := targets
} else := [breakglass_finding] if {
	input.action == "breakglass.request"
} else := [emergency_finding] if {
	input.action == "emergency.stop"
} else := [lift_finding] if {
	input.action == "emergency.lift"
} else := [confirm_finding(t) | some t in ts] if {
	input.action == "job.confirm_stopped"
	has_targets
	ts := targets
} else := [resume_finding(t) | some t in ts] if {
	input.action == "job.resume"
	has_targets
	ts := targets
} else := [undelete_finding(t) | some t in ts] if {
	input.action == "job.undelete"
	has_targets
	ts := targets
} else := [] if {
	# An extension job action naming no jobs has no subject: denied by default.
	extension_action
} else := [project_finding]
