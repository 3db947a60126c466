# Second person (M2) and how many (R3, H2, C2). For each granted subject: the approvals it needs,
# who may give them, and how many valid ones are already recorded in input.approvals.
package jobgate.authz

import rego.v1

# Each granted finding's need. `missing` = required - recorded valid approvals (never below zero).
needs contains w if {
	second_person_possible
	fs := findings
	some f in fs
	f.kind == "grant"
	required := required_approvals(f)
	required > 0
	eligible := eligible_for(f)
	have := count(approvers(f, eligible))
	w := {
		"subject": f.subject,
		"rule": f.rule,
		"reason": f.reason,
		"required": required,
		"missing": max([0, required - have]),
		"eligible": eligible,
	}
}

# Whether any subject can need a second person at all: a rule asking for one, or a notch (R3, H2).
# Checked first, so the common request that needs nobody skips the per-subject work below.
# `default ... := false`: rego-cpp caches a rule's value within a query only when the rule is defined, so a
# false rule without a default is evaluated again at every reference.
default second_person_possible := false

second_person_possible if {
	fs := findings
	some f in fs
	f.base > 0
}

second_person_possible if any_external_target

second_person_possible if cross_project_batch

default any_external_target := false

any_external_target if {
	ts := targets
	some t in ts
	t.external_rights == true
}

# Raise the rule's own need one notch per aggravating fact, then to the granularity floor (C2).
required_approvals(f) := f.base if {
	# A finding that counts its own approvals (emergency stops, emergency.rego) is taken as is.
	f.own_count == true
} else := n if {
	raised := (f.base + external_notch(f)) + cross_project_notch
	raised > 0
	n := max([raised, confirmations_floor])
} else := 0

confirmations_floor := object.get(data.confirmations, granularity, 1)

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
	"reason": sprintf("a %s-level action needs %d confirmations", [input.granularity, confirmations_floor]),
} if {
	input.granularity != "job"
	count(needs) > 0
	not input.action in unbatched_actions
}

# Who may confirm: the rule's own eligible set, or — when only a notch requires a second person — the
# default second person for that job (its owner, a queue admin of its project, on-call).
# `is_object` rather than a bare `f.target`: the same outcome for every value (second_person of a
# non-object is undefined), without rego-cpp serialising the job to test it against false.
eligible_for(f) := f.eligible if {
	f.base > 0
} else := second_person(f.target) if {
	is_object(f.target)
} else := {"roles": ["platform_admin"], "principals": [], "projects": ["*"]}

# Valid approvals: by someone other than the actor (M2), still fresh, and from an eligible person.
approvers(f, eligible) := {a.by |
	some a in given
	a.by != actor
	fresh(a)
	approval_matches(a, f, eligible)
} if {
	given := approvals_given
}

# By name, as the job's owner (the gateway marks approvals given by the owner: A4 owner consent), or
# by an eligible role in an eligible project. One definition with `else` (see owns).
approval_matches(a, f, eligible) := true if {
	a.by in eligible.principals
} else := true if {
	f.target.owner in eligible.principals
	f.target.id in object.get(a, "is_owner_of", [])
} else := true if {
	some p in eligible.projects
	some role in object.get(object.get(a, "roles_by_project", {}), p, [])
	role in eligible.roles
}

# An approval without a timestamp is bound and expired by the gateway; one with `at` is checked here.
fresh(a) := true if {
	object.get(a, "at", null) == null
} else := true if {
	age_ns := rfc3339_ns(input.now) - rfc3339_ns(a.at)
	age_ns <= data.approval.expiry_seconds * 1000000000
}

# rego-cpp does not parse a trailing "Z"; "+00:00" means the same instant in every engine.
rfc3339_ns(ts) := time.parse_rfc3339_ns(replace(ts, "Z", "+00:00"))
