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

# Stop / preempt (A4, A8, R4, Q6).
# 1. R4: the system reclaims a job past its validity period; Q6: it stops the rest of a gang one of whose
#    members failed. Nothing else may act as the system.
# 2. The creator or owner stops their own job; a job a service account started is its own only for that
#    account (a pipeline cancelling its run), not for the person responsible for it (A8, next).
# 3. A8: a job a service account started is stopped by on-call only, with a second person.
# 4. A4: another's job is stopped only with a written reason (the audit record names it).
# 5. A4: a queue admin (own project) or on-call stops another's job, with a second person.
# 6. A4 cross-project: a queue admin of another project needs the job owner's consent.
stop_finding(t) := system_stop_finding(t) if {
	actor_kind == "system"
} else := grant_alone("A4.own_job", sprintf("%s stops their own job %s", [actor, t.id]), t, []) if {
	stops_own(t)
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

# R4: the system reclaims expired jobs. Q6: a job past its declared runtime limit is stopped; a gang runs whole
# or not at all, so when a member fails the others, which wait on it (often until a collective operation times
# out, holding their GPUs), are stopped.
system_stop_finding(t) := grant_alone(
	"R4.reclaim_expired", sprintf("job %s is past its validity period and is reclaimed by the system", [t.id]),
	t, [notify_owner(t)],
) if {
	t.expired == true
} else := grant_alone(
	# Q6: a job that declared a runtime limit may have been let onto GPUs held for a larger job on that
	# promise (backfill); overrunning it would delay that job without bound, so the limit is kept.
	"Q6.runtime_limit", sprintf("job %s ran past its declared runtime limit and is stopped by the system", [t.id]),
	t, [notify_owner(t)],
) if {
	t.over_runtime_limit == true
} else := grant_alone(
	"Q6.gang_member_failed",
	# %v, not concat: the embedded engine's sprintf quotes a string that concat made.
	sprintf("gang job %s has a failed member (on %v); the system stops the others, which cannot go on without it", [t.id, t.failed_members]),
	t, [notify_owner(t)],
) if {
	count(t.failed_members) > 0
} else := refuse(
	"R4.not_expired",
	sprintf("the system stops only expired jobs, jobs past their runtime limit and gangs with a failed member; job %s is none of these", [t.id]),
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

# A8 gives the stop of a job a service account started to on-call, with a second person. Such a job is
# "own", for a stop, only to the account that started it (a pipeline cancelling its run); the person
# responsible for the account, its owner, goes the A8 way like everyone else.
stops_own(t) := true if {
	t.creator == actor
} else := true if {
	t.owner == actor
	not t.creator_kind == "service"
}

# Projects where the actor may stop others' jobs (for the cross-project branch above).
stop_any_projects contains p if {
	some p, cs in granted
	"job.stop.any" in cs
}

# A3/A4: the owner must hear of it. The written reason the audit record needs is required by the branches
# that call this (a reason of blanks is none), not left to an obligation nobody carries out.
others_job_obligations(t) := [notify_owner(t)]

# Priority / queue position (A2 own, A3 another's with a second person).
# A2 lets an owner order her own work, not jump the queue: alone she may set her job at most to
# max(its priority now, its unadjusted priority), the unadjusted one being what the scheduler alone gives it
# (now minus the manual part). So she may lower it (give way) and take that lowering back, never push it
# above what the scheduler computes; a value up to 1,000,000 would run before every waiting job, urgent
# ones too, and never be picked as a preemption victim. Raising it higher is a change of the queue for
# everyone else, so it goes the A3 way: an owner who is also a queue admin or on-call gives a written
# reason and a second person confirms; any other owner is refused, told the most she may set herself.
# The gateway puts `priority` and `unadjusted_priority` on each target when a value is asked
# (input.params.priority); a renewal (P3, params.renew) asks none and is the owner's alone.
priority_finding(t) := grant_alone(
	"A2.own", sprintf("%s changes the priority of their own job %s", [actor, t.id]), t, [],
) if {
	owns(t)
	"job.priority.own" in granted[t.project]
	own_priority_change(t)
} else := refuse(
	"A2.priority_unknown",
	sprintf("the current priority of job %s is not known, so an owner's own change of it cannot be judged", [t.id]),
	t.id,
) if {
	owns(t)
	not own_priority_ceiling(t)
} else := refuse(
	"A2.raise_needs_admin",
	sprintf("%s may set their own job %s at most to %v (its priority now, or what the scheduler alone gives it); a higher value puts it ahead of others' jobs and needs a queue admin or on-call of project %s, with a written reason and a second person", [actor, t.id, priority_said_down(own_priority_ceiling(t)), t.project]),
	t.id,
) if {
	owns(t)
	"job.priority.own" in granted[t.project]
	not "job.priority.any" in granted[t.project]
} else := refuse(
	"A3.reason_required",
	sprintf("raising your own job %s above %v puts it ahead of others' jobs: it needs a written reason", [t.id, priority_said(own_priority_ceiling(t))]),
	t.id,
) if {
	owns(t)
	not reason_given
	"job.priority.any" in granted[t.project]
} else := grant(
	"A3.own_raise",
	sprintf("%s raises their own job %s above %v, the most an owner may set alone; a second person must confirm", [actor, t.id, priority_said(own_priority_ceiling(t))]),
	t, 1, second_person(t), [],
) if {
	owns(t)
	"job.priority.any" in granted[t.project]
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

# Whether an owner's change stays within A2: no value asked (a renewal), or one no higher than the job's
# priority now, or than its unadjusted priority give or take own_priority_slack.
own_priority_change(t) := true if {
	not asks_priority_value
} else := true if {
	v := input.params.priority
	is_number(v)
	v <= t.priority
} else := true if {
	v := input.params.priority
	is_number(v)
	v <= t.unadjusted_priority + own_priority_slack
}

default asks_priority_value := false

asks_priority_value if {
	_ := input.params.priority
}

# The most an owner may set alone (for the sentences): the higher of now and unadjusted.
own_priority_ceiling(t) := t.priority if {
	t.priority >= t.unadjusted_priority
} else := t.unadjusted_priority if {
	is_number(t.unadjusted_priority)
}

# Priorities are said to people to two decimals (570.05, not 570.0491041888889); the most she may set is rounded
# down, so that the value the message names is one she may set.
priority_said(x) := round(x * 100) / 100

priority_said_down(x) := floor(x * 100) / 100

# Taking a lowering back means setting the unadjusted value, which the gateway computes as now - manual:
# in floating point that can come out an ulp below the value the owner read before lowering. A millionth
# of a priority point absorbs it and cannot ratchet (it is added to the unadjusted value, which an owner's
# own change never moves, not to the value now).
own_priority_slack := 0.000001

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
