# Findings: one per subject of the request. A subject is a target job for job actions (each judged on
# its own, then combined in authz.rego), or the request's project for project-level actions.
# A finding is {"kind": "grant"|"deny", "rule", "reason", "subject", ...}; a grant also carries `base`
# (second persons the rule itself needs), `eligible` (who may be that second person) and `obligations`.
package jobgate.authz

import rego.v1

job_actions := {"job.stop", "job.priority", "job.pause", "job.delete"}

targets := object.get(input, "targets", [])

actor := input.actor.id

# Project for project-level checks; "*" when the request names none (global actions such as reload).
request_project := p if {
	p := input.project
	is_string(p)
} else := "*"

# Capabilities the actor holds in project p (computed by the engine from Casbin; global roles included).
caps(p) := object.get(object.get(input, "granted", {}), p, [])

holds(p, capability) if capability in caps(p)

verb := split(input.action, ".")[1]

# A2/A4/A5: the creator and the responsible owner both count as "own job".
owns(t) if t.owner == actor

owns(t) if t.creator == actor

reason_given if {
	r := object.get(input, "reason", null)
	is_string(r)
	trim_space(r) != ""
}

# Capability names used in sentences. They are looked up here rather than written as literals at the
# call sites because rego-cpp 1.x formats a string literal passed as a function argument with its
# quotes still on.
cap := {
	"view": "job.view",
	"stop_service": "job.stop.service",
	"delete_own": "job.delete.own",
}

missing_capability(p, capability) := sprintf("%s holds no role in project %s that grants %s", [actor, p, capability])

grant(rule, reason, subject, base, eligible, obligations) := {
	"kind": "grant", "rule": rule, "reason": reason, "subject": subject,
	"base": base, "eligible": eligible, "obligations": obligations,
}

refuse(rule, reason, subject) := {"kind": "deny", "rule": rule, "reason": reason, "subject": subject}

nobody := {"roles": [], "principals": [], "projects": []}

# Default second person for another's job (A3, A4): its owner, a queue admin of its project, or on-call.
second_person(t) := {
	"roles": ["oncall", "queue_admin"],
	"principals": [p |
		some p in {t.owner}
		p != actor
	],
	"projects": ["*", t.project],
}

notify_owner(t) := {"kind": "notify_owner", "job": t.id, "owner": t.owner}

# Job actions: one finding per target.
findings contains object.union(job_finding(t), {"target": t}) if {
	input.action in job_actions
	some t in targets
}

# A1: viewing named jobs is judged per job; viewing without targets is a project-level view.
findings contains object.union(view_finding(t), {"target": t}) if {
	input.action == "job.view"
	some t in targets
}

findings contains project_finding if {
	not job_action_on_targets
	not job_view_of_targets
}

job_action_on_targets if {
	input.action in job_actions
	count(targets) > 0
}

job_view_of_targets if {
	input.action == "job.view"
	count(targets) > 0
}
