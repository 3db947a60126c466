# Second person (M2) and how many (R3, H2, C2). For each granted subject: the approvals it needs,
# who may give them, and how many valid ones are already recorded in input.approvals.
#
# Every request that may need a second person comes through here, each approval once per subject, so
# this path is written without builtin calls where Rego has a plain form for the same test (cost notes
# in subjects.rego): `not x == y` over bound values for `x != y`, iteration with `==` for `x in xs`,
# a lookup with a fallback for object.get. Builtins remain where nothing else says it: timestamps,
# counting, and the arithmetic of the need.
package jobgate.authz

import rego.v1

# One entry per granted subject that needs approvals: how many (`required`), from whom (`eligible`),
# and how many are still `missing` (required - recorded valid approvals; below zero when more were
# given than needed, and only entries above zero are read). An array in findings order, not a set:
# rego-cpp serialises every member of a set on each insert, and every reader takes maxima and unions,
# which duplicates do not change.
approval_needs := [n |
	some f in fs
	n := approval_need(f)
] if fs := findings

# A granted subject whose own rule asks for a second person (base > 0) needs what its rule says, from
# the rule's eligible set. Otherwise it needs someone only where a notch applies (R3, H2), from the
# default second person for its job (eligible_for_notch).
# (Tests stay in function bodies: rego-cpp compiles `==` inside a comprehension as a builtin call.)
approval_need(f) := need_entry(f, own_required(f), f.eligible) if {
	f.kind == "grant"
	f.base > 0
} else := need_entry(f, required, eligible_for_notch(f)) if {
	f.kind == "grant"
	notch_possible
	# A finding that counts its own approvals (emergency stops) is taken as is: base 0 needs no one.
	not f.own_count == true
	raised := (f.base + external_notch(f)) + cross_project_notch
	raised > 0
	required := max([raised, confirmations_floor])
}

# What authz.rego reads: the reason, how many are missing, and from whom.
need_entry(f, required, eligible) := {
	"reason": f.reason,
	"required": required,
	"missing": missing,
	"eligible": eligible,
} if {
	missing := missing_approvals(required, approvers(f, eligible))
}

# A function, so that a need that is no number leaves its entry out: rego-cpp would put an undefined
# difference into the object literal rather than drop the entry.
missing_approvals(required, given) := required - count(given)

# The second persons each subject needs, as `jobgate policy explain` shows them (missing never below
# zero). The decision itself reads approval_needs.
needs contains {
	"subject": f.subject,
	"rule": f.rule,
	"reason": n.reason,
	"required": n.required,
	"missing": max([0, n.missing]),
	"eligible": n.eligible,
} if {
	fs := findings
	some f in fs
	n := approval_need(f)
}

# The rule's own need raised to the granularity floor (C2), then one notch per aggravating fact on top:
# a notch is an approval *more* than the same request would need without it (R3, H2), so the floor must
# not absorb it (a batch of two is already at the workload floor of 2; crossing projects makes it 3).
# A finding that counts its own approvals (emergency stops, emergency.rego) is taken as is.
own_required(f) := f.base if {
	f.own_count == true
} else := confirmations_floor if {
	# The usual case, answered without arithmetic (builtin calls): no notch applies to any subject of
	# this request, and the rule asks for as many as the floor.
	not notch_possible
	f.base == confirmations_floor
} else := (max([f.base, confirmations_floor]) + external_notch(f)) + cross_project_notch

# Whether a notch can apply to this request at all: an external-rights target (R3) or a cross-project
# batch (H2). Cached, so the common request pays one test for both.
# `default ... := false`: rego-cpp caches a rule's value within a query only when the rule is defined, so a
# false rule without a default is evaluated again at every reference.
default notch_possible := false

notch_possible if any_external_target

notch_possible if cross_project_batch

default any_external_target := false

any_external_target if {
	ts := targets
	some t in ts
	t.external_rights == true
}

# A lookup first (object.get is a builtin call); object.get stays for what the lookup does not find,
# because it also reads an array as a path of keys.
confirmations_floor := n if {
	n := data.confirmations[granularity]
} else := object.get(data.confirmations, granularity, 1)

approvals_given := a if {
	a := input.approvals
} else := []

granularity := g if {
	g := input.granularity
} else := "job"

external_notch(f) := data.external_rights_extra_approvals if {
	external_target(f)
} else := 0

cross_project_notch := data.cross_project_extra_approvals if {
	cross_project_batch
} else := 0

# R3: a job on external-rights data is one notch stricter for every mutating action.
external_target(f) if {
	mutating
	f.target.external_rights == true
}

# H2: a batch touching more than one project needs an extra approval.
default cross_project_batch := false

cross_project_batch if {
	batch
	count(target_projects) > 1
	mutating
	not input.action in unbatched_actions
}

# The notches that applied, for the audit record.
notches_fired contains {"rule": "R3.one_notch_stricter", "reason": sprintf("job %s uses external-rights data: one more approval is required", [f.target.id])} if {
	any_external_target
	fs := findings
	some f in fs
	f.kind == "grant"
	external_target(f)
}

notches_fired contains {"rule": "H2.cross_project_batch", "reason": "the batch spans several projects: one more approval is required"} if {
	cross_project_batch
}

notches_fired contains {
	"rule": "C2.granularity",
	"reason": sprintf("a %s-level action needs %d confirmations", [g, confirmations_floor]),
} if {
	g := input.granularity
	not g == "job"
	ns := approval_needs
	ns[0].missing # some subject needs approvals
	not input.action in unbatched_actions
}

# Who may confirm when only a notch requires a second person: the default second person for that job
# (its owner, a queue admin of its project, on-call), or a platform admin for a subject without a job.
# `is_object` rather than a bare `f.target`: the same outcome for every value (second_person of a
# non-object is undefined), without rego-cpp serialising the job to test it against false.
eligible_for_notch(f) := second_person(f.target) if {
	is_object(f.target)
} else := {"roles": ["platform_admin"], "principals": [], "projects": ["*"]}

# Valid approvals for one subject: those that can count (below) from an eligible person.
approvers(f, eligible) := {a.by |
	some a in given
	approval_matches(a, f, eligible)
} if {
	given := second_person_approvals
}

# Approvals that can count as the second person: by someone other than the actor (M2) and not
# expired. The same for every subject, so checked once per request.
second_person_approvals := [a |
	some a in given
	second_person_approval(a)
] if {
	given := approvals_given
}

second_person_approval(a) if {
	by := a.by
	me := actor
	not by == me
	fresh(a)
}

# By name, as the job's owner (the gateway marks approvals given by the owner: A4 owner consent), or
# by an eligible role in an eligible project. One definition with `else` (see owns).
approval_matches(a, f, eligible) := true if {
	by := a.by
	some p in eligible.principals
	p == by
} else := true if {
	owner := f.target.owner
	some p in eligible.principals
	p == owner
	id := f.target.id
	some j in a.is_owner_of
	j == id
} else := true if {
	held := approver_roles(a)
	some p in eligible.projects
	some role in held[p]
	eligible_role(role, eligible)
} else := true if {
	# A project named by an array is read as a path of keys by object.get (never one the gateway sends).
	some p in eligible.projects
	is_array(p)
	some role in object.get(object.get(a, "roles_by_project", {}), p, [])
	role in eligible.roles
}

# The approver's roles by project: an object, as the gateway records them (object.get, which the
# lookup above replaces, read nothing from anything else).
approver_roles(a) := held if {
	held := a.roles_by_project
	is_object(held)
}

eligible_role(role, eligible) if {
	some r in eligible.roles
	r == role
}

# An approval without a timestamp is bound and expired by the gateway; one with `at` is checked here.
# The value is the comparison, so an approval with a time (the usual case) is judged in one branch.
fresh(a) := rfc3339_ns(at) >= oldest_fresh_ns if {
	at := a.at
	not at == null
} else := true if {
	# No `at`, or null. (A time that does not parse comes here too, and is not fresh.)
	approval_time(a) == null
}

# `at`, or null when the approval has none: a lookup with a fallback, as object.get(a, "at", null).
approval_time(a) := at if {
	at := a.at
} else := null

# M2: an approval given before this instant has expired (data.approval.expiry_seconds before now).
oldest_fresh_ns := rfc3339_ns(input.now) - (data.approval.expiry_seconds * 1000000000)

# rego-cpp does not parse a trailing "Z"; "+00:00" means the same instant in every engine. The plain
# parse comes first (the gateway writes "+00:00"), so the replace runs only for a time it refuses.
rfc3339_ns(ts) := ns if {
	ns := time.parse_rfc3339_ns(ts)
} else := time.parse_rfc3339_ns(replace(ts, "Z", "+00:00"))
