# The one decision the gateway asks for: data.jobgate.authz.decision.
#
# Every other file in this package contributes findings; this file only combines them:
#   1. any denial            -> deny            (deny wins)
#   2. any approval missing  -> needs_approval  (M2: the server waits for the second person)
#   3. every subject granted -> allow
#   4. anything else         -> deny by default (never fail open)
# Capabilities come precomputed in input.granted[project] (Casbin, matrix.csv); this package never
# reads role bindings, only capabilities — and the roles recorded on approvals.
#
# Collections are iterated through a local (`fs := findings; some f in fs`), never as `some f in findings`:
# rego-cpp tests a referenced rule's value against false before iterating it, and that test serialises
# the whole value (findings carry their target jobs), costing more than the iteration itself.
# Whether a collection has a member is asked with an index (`fs[0].kind`) or one iteration step, never
# `count(fs) > 0`: `count` and `>` are builtin calls, the costliest statements here (subjects.rego).
package jobgate.authz

import rego.v1

no_approvals := {"count": 0, "roles": [], "principals": [], "projects": []}

# Fail closed: a request no rule below recognises is refused, with a reason (DESIGN "Policies").
default decision := {
	"effect": "deny",
	"reasons": ["no policy rule grants this request; denied by default"],
	"rules": ["default_deny"],
	"approvals_required": {"count": 0, "roles": [], "principals": [], "projects": []},
	"obligations": [],
}

# The reasons of a deny are sorted: they come from a set, which OPA iterates in sorted order and rego-cpp in
# the order its members were added, so two denials (two emergency holds) read in a different order on each.
decision := {
	"effect": "deny",
	"reasons": sort([d.reason | some d in ds]),
	"rules": sort({d.rule | some d in ds}),
	"approvals_required": no_approvals,
	"obligations": [],
} if {
	denied
	ds := denials
} else := {
	"effect": "needs_approval",
	"reasons": waiting_reasons,
	"rules": fired_rules,
	"approvals_required": approvals_required,
	"obligations": sort(obligations),
} if {
	any_waiting
} else := {
	"effect": "allow",
	"reasons": [f.reason | some f in fs],
	"rules": fired_rules,
	"approvals_required": no_approvals,
	"obligations": sort(obligations),
} if {
	# No denial above means every finding is a grant (each deny finding is a denial).
	fs := findings
	fs[0].kind # some finding
}

# Whether anything is denied (a set: asked by iterating, see above).
default denied := false

denied if {
	ds := denials
	some _ in ds
}

# Denials: every `deny` finding plus the guards in guards.rego.
denials contains {"rule": f.rule, "reason": f.reason} if {
	fs := findings
	some f in fs
	f.kind == "deny"
}

# Subjects still waiting for approvals (M2), with how many are missing.
waiting := [n |
	some n in ns
	n.missing > 0
] if ns := approval_needs

default any_waiting := false

any_waiting if {
	ws := waiting
	ws[0].missing # some subject waits
}

# Why the request waits: each waiting subject's reason and each notch's. rego-cpp iterates a set in the
# order its members were added, except the result of `|`, which comes out ordered: so these reasons are
# listed through the union, never through a set built another way (that would reorder them).
waiting_reasons := [r | some r in ({w.reason | some w in ws} | notch_reasons)] if ws := waiting

notch_reasons := {n.reason | some n in ns} if ns := notches_fired

# Sorted, so the way the set is built does not matter: one rule with two bodies rather than a union
# (rego-cpp keys every member of a set by serialising it, and `|` builds a third set).
fired_rules := sort(rule_ids)

rule_ids contains f.rule if {
	fs := findings
	some f in fs
}

# A notch fires only where a second person is possible (R3 external target, H2 cross-project batch,
# C2 with a need); each of its rules tests that first.
rule_ids contains n.rule if {
	ns := notches_fired
	some n in ns
}

approval_expiry_obligation := {"kind": "approval_expiry", "seconds": data.approval.expiry_seconds}

approvals_required := {
	"count": max([w.missing | some w in ws]),
	"roles": sort({v |
		some w in ws
		some v in w.eligible.roles
	}),
	"principals": sort({v |
		some w in ws
		some v in w.eligible.principals
	}),
	"projects": sort({v |
		some w in ws
		some v in w.eligible.projects
	}),
} if {
	ws := waiting
}

# Obligations the gateway must carry out when it executes (notify owner, grace window, ...).
obligations contains o if {
	fs := findings
	some f in fs
	f.kind == "grant"
	some o in f.obligations
}

# M2: a request that waits for a second person says how long an approval stays valid.
obligations contains approval_expiry_obligation if {
	any_waiting
}

# P4: every stop goes through prepare signal, grace window, then forced kill.
obligations contains {"kind": "grace_window", "seconds": data.stop.grace_window_seconds} if {
	input.action == "job.stop"
}
