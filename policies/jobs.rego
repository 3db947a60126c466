# Per-job rules of the action matrix (A1-A6, A8) and expiry reclaim (R4).
# Each function is an ordered list: the first branch whose conditions hold decides the job.
package jobgate.authz

import rego.v1

# A1: members of the job's project (any role there, or a global role) may view it. External-rights
# jobs are sensitive, so their reads are logged as such.
view_finding(t) := grant_alone(
	"A1.member", sprintf("%s is a member of project %s", [actor, t.project]), t,
	[{"kind": "log_read", "job": t.id, "sensitivity": sensitivity(t)}],
) if {
	"job.view" in granted[t.project]
} else := refuse("A1.not_member", missing_capability(t.project, cap.view), t.id)

sensitivity(t) := "external_rights" if {
	t.external_rights == true
} else := "normal"

# Stop / preempt (A4, A8, R4).
# 1. R4: the system reclaims a job past its validity period; nothing else may act as the system.
# 2. The creator or owner stops their own job.
# 3. A8: a job a service account started is stopped by on-call only, with a second person.
# 4. A4: another's job is stopped only with a written reason (the audit record names it).
# 5. A4: a queue admin (own project) or on-call stops another's job, with a second person.
# 6. A4 cross-project: a queue admin of another project needs the job owner's consent.
stop_finding(t) := system_stop_finding(t) if {
	actor_kind == "system"
} else := grant_alone("A4.own_job", sprintf("%s stops their own job %s", [actor, t.id]), t, []) if {
	owns(t)
	"job.stop.own" in granted[t.project]
} else := service_stop_finding(t) if {
	t.creator_kind == "service"
} else := refuse(
	"A4.reason_required", sprintf("%s's job %s is not yours: stopping it needs a written reason", [t.owner, t.id]), t.id,
) if {
	not reason_given
	count(stop_any_projects) > 0
} else := grant(
	"A4.second_person", sprintf("%s stops %s's job %s; a second person must confirm", [actor, t.owner, t.id]),
	t, 1, second_person(t), others_job_obligations(t),
) if {
	"job.stop.any" in granted[t.project]
} else := grant(
	"A4.cross_project_owner_consent",
	sprintf("%s may stop others' jobs in another project but not in project %s; the job owner %s must consent", [actor, t.project, t.owner]),
	t, 1, {"roles": [], "principals": [t.owner], "projects": []}, others_job_obligations(t),
) if {
	count(stop_any_projects) > 0
} else := refuse("A4.no_capability", missing_capability(t.project, own_or_any(t)), t.id)

# R4: the system acts only on expired jobs.
system_stop_finding(t) := grant_alone(
	"R4.reclaim_expired", sprintf("job %s is past its validity period and is reclaimed by the system", [t.id]),
	t, [notify_owner(t)],
) if {
	t.expired == true
} else := refuse(
	"R4.not_expired", sprintf("the system reclaims only expired jobs; job %s is not past its validity period", [t.id]),
	t.id,
)

# A8: only on-call stops a job a service account started, and a second person confirms.
service_stop_finding(t) := grant(
	"A8.service_job", sprintf("%s stops job %s started by service account %s; a second person must confirm", [actor, t.id, t.creator]),
	t, 1, second_person(t), [notify_owner(t)],
) if {
	"job.stop.service" in granted[t.project]
} else := refuse(
	"A8.oncall_only",
	sprintf("%s (job %s was started by service account %s; only on-call may stop it)", [missing_capability(t.project, cap.stop_service), t.id, t.creator]),
	t.id,
)

# Projects where the actor may stop others' jobs (for the cross-project branch above).
stop_any_projects contains p if {
	some p, cs in granted
	"job.stop.any" in cs
}

# A3/A4: the owner must hear of it. The written reason the audit record needs is required by the branches
# that call this (a reason of blanks is none), not left to an obligation nobody carries out.
others_job_obligations(t) := [notify_owner(t)]

# Priority / queue position (A2 own, A3 another's with a second person).
priority_finding(t) := grant_alone(
	"A2.own", sprintf("%s changes the priority of their own job %s", [actor, t.id]), t, [],
) if {
	owns(t)
	"job.priority.own" in granted[t.project]
} else := refuse(
	"A3.reason_required",
	sprintf("%s's job %s is not yours: changing its priority needs a written reason", [t.owner, t.id]), t.id,
) if {
	not reason_given
	"job.priority.any" in granted[t.project]
} else := grant(
	"A3.second_person", sprintf("%s changes the priority of %s's job %s; a second person must confirm", [actor, t.owner, t.id]),
	t, 1, second_person(t), others_job_obligations(t),
) if {
	"job.priority.any" in granted[t.project]
} else := refuse("A3.no_capability", missing_capability(t.project, own_or_any(t)), t.id)

# Pause keeping a checkpoint (A5): own jobs freely; others' jobs by on-call, telling the owner.
pause_finding(t) := grant_alone(
	"A5.own", sprintf("%s pauses their own job %s", [actor, t.id]), t,
	[{"kind": "keep_checkpoint", "job": t.id}],
) if {
	owns(t)
	"job.pause.own" in granted[t.project]
} else := grant_alone(
	"A5.notify_owner", sprintf("%s pauses %s's job %s; the owner is notified", [actor, t.owner, t.id]), t,
	[{"kind": "keep_checkpoint", "job": t.id}, notify_owner(t)],
) if {
	"job.pause.any" in granted[t.project]
} else := refuse("A5.no_capability", missing_capability(t.project, own_or_any(t)), t.id)

# Delete a job and its artifacts (A6): only the responsible owner, and only with the consent of the
# rights holder of its data — a queue admin of the rights-holder project confirms.
delete_finding(t) := grant(
	"A6.rights_holder_consent",
	sprintf("%s deletes job %s; the rights holder %s must consent", [actor, t.id, t.rights_holder]),
	t, 1, {"roles": ["queue_admin"], "principals": [], "projects": [t.rights_holder]},
	[{"kind": "recovery_window", "job": t.id}],
) if {
	t.owner == actor
	"job.delete.own" in granted[t.project]
} else := refuse(
	"A6.owner_only", sprintf("only the owner %s may delete job %s", [t.owner, t.id]), t.id,
) if {
	t.owner != actor
} else := refuse("A6.no_capability", missing_capability(t.project, cap.delete_own), t.id)

# Name the capability the actor lacks: ".own" for their own job, ".any" for another's.
# Built from input.action with sprintf: rego-cpp 1.x quotes a concat result, or a literal argument,
# when it is formatted again.
own_or_any(t) := sprintf("%s.own", [input.action]) if {
	owns(t)
} else := sprintf("%s.any", [input.action])
