# Emergency stops (C2, C6) and the hold they keep on their scope, and the stop-area job actions: on-call
# confirming a stop by hand (C3), resuming a paused job (A5) and undeleting within the recovery window (A6).
package jobgate.authz

import rego.v1

# Actions judged here rather than in actions.rego / jobs.rego (subjects.rego dispatches them here).
extension_actions := {"emergency.stop", "emergency.lift", "job.confirm_stopped", "job.resume", "job.undelete"}

extension_job_actions := {"job.confirm_stopped", "job.resume", "job.undelete"}

# An emergency stop names every job in its scope; its own ceiling replaces the H2 batch limits.
unbatched_actions := {"emergency.stop"}

default extension_action := false

extension_action if input.action in extension_actions

ext_cap := {
	"emergency": "emergency.stop",
	"confirm": "job.confirm_stopped",
	"pause_own": "job.pause.own",
	"pause_any": "job.pause.any",
	"delete_own": "job.delete.own",
}

emergency_roles := {"oncall", "security_reviewer"}

# Named rather than written at call sites: rego-cpp 1.x keeps the quotes of a literal function argument.
global_project := "*"

scope_subject := "scope"

actor_emergency_roles := {r |
	some r in object.get(object.get(input.actor, "roles", {}), global_project, [])
	r in emergency_roles
}

# C6: the second person holds the *other* of the two roles (both, if the actor holds neither or both).
emergency_approver_roles := emergency_roles - actor_emergency_roles if {
	count(emergency_roles - actor_emergency_roles) > 0
} else := emergency_roles

emergency_granularity := granularity

emergency_trigger := object.get(object.get(input, "params", {}), "trigger", "")

# One finding for the whole request; `own_count` tells approvals.rego to use data.emergency as is.
emergency_finding := refuse(
	"C6.trigger_required",
	"an emergency stop must name its trigger: safety or security",
	scope_subject,
) if {
	not emergency_trigger in {"safety", "security"}
} else := refuse(
	"C2.emergency_ceiling",
	sprintf("the scope holds %d jobs; an emergency stop may name at most %d", [target_count, data.emergency.max_targets]),
	scope_subject,
) if {
	target_count > data.emergency.max_targets
} else := object.union(
	project_grant(
		"C2.emergency_stop",
		sprintf("%s requests a %s-level emergency stop (%s concern) of %d jobs", [actor, emergency_granularity, emergency_trigger, target_count]),
		scope_subject, object.get(data.emergency.approvals, emergency_granularity, 1),
		{"roles": sort(emergency_approver_roles), "principals": [], "projects": ["*"]},
		[{"kind": "notify_owners", "jobs": sort([t.id | some t in targets])}],
	),
	{"own_count": true},
) if {
	holds(global_project, ext_cap.emergency)
} else := refuse("C2.no_capability", missing_capability(global_project, ext_cap.emergency), scope_subject)

# C2: a workload or scope stop keeps its scope closed to new jobs (guards.rego, C2.emergency_hold) until someone
# who may make emergency stops lifts that hold, saying why in writing.
lift_finding := refuse(
	"C2.lift_reason_required",
	sprintf("lifting the hold of emergency stop %v needs a written reason", [input.params.emergency_id]),
	scope_subject,
) if {
	holds(global_project, ext_cap.emergency)
	not reason_given
} else := project_grant(
	"C2.lift_hold",
	sprintf("%s lifts the hold of emergency stop %v (%v concern): new jobs may be submitted to its scope again", [actor, input.params.emergency_id, input.params.trigger]),
	scope_subject, 0, nobody, [],
) if {
	holds(global_project, ext_cap.emergency)
} else := refuse("C2.no_capability", missing_capability(global_project, ext_cap.emergency), scope_subject)

# C3: only on-call vouches that a job whose stop failed (or whose node is lost) no longer runs.
confirm_finding(t) := grant(
	"C3.oncall_confirms", sprintf("%s confirms that job %s no longer runs", [actor, t.id]), t, 0, nobody,
	[notify_owner(t)],
) if {
	holds(t.project, ext_cap.confirm)
	reason_given
} else := refuse(
	"C3.reason_required", sprintf("confirming job %s stopped needs a written reason", [t.id]), t.id,
) if {
	holds(t.project, ext_cap.confirm)
} else := refuse("C3.oncall_only", missing_capability(t.project, ext_cap.confirm), t.id)

# A5: whoever may pause a job may resume it; another's job tells its owner.
resume_finding(t) := grant(
	"A5.resume_own", sprintf("%s resumes their own job %s", [actor, t.id]), t, 0, nobody, [],
) if {
	owns(t)
	holds(t.project, ext_cap.pause_own)
} else := grant(
	"A5.resume_notify_owner", sprintf("%s resumes %s's job %s; the owner is notified", [actor, t.owner, t.id]),
	t, 0, nobody, [notify_owner(t)],
) if {
	holds(t.project, ext_cap.pause_any)
} else := refuse("A5.no_capability", missing_capability(t.project, ext_cap.pause_any), t.id)

# A6: within the recovery window the owner may take a delete back.
undelete_finding(t) := grant(
	"A6.undelete_owner", sprintf("%s restores their deleted job %s", [actor, t.id]), t, 0, nobody, [],
) if {
	t.owner == actor
	holds(t.project, ext_cap.delete_own)
} else := refuse("A6.owner_only", sprintf("only the owner %s may restore job %s", [t.owner, t.id]), t.id)
