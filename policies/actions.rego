# Project-level actions: submitting, viewing a project, quotas, roles, policy reloads, ledger reads,
# granting approvals. One finding for the request's project.
package jobgate.authz

import rego.v1

# Capability each project-level action needs; job actions on targets are in jobs.rego.
project_capability := {
	"job.submit": "job.submit",
	"job.view": "job.view",
	"quota.change": "quota.change",
	"role.manage": "role.manage",
	"policy.reload": "policy.reload",
	"ledger.read": "ledger.read",
	"approval.grant": "approval.grant",
}

# A7: changing or borrowing quota needs a platform admin plus a second platform admin.
project_finding := project_grant(
	"A7.second_person",
	sprintf("%s changes the quota of project %s; a second platform admin must confirm", [actor, request_project]),
	request_project, 1, {"roles": ["platform_admin"], "principals": [], "projects": ["*"]}, [],
) if {
	input.action == "quota.change"
	holds(request_project, "quota.change")
} else := refuse(
	# Q2/Q8: urgent jobs preempt lower-priority running jobs, of any project, without asking their owners.
	# Choosing that queue is therefore a preemption right (A4), held by queue admins, not every member.
	"Q2.urgent_queue",
	sprintf("an urgent job may preempt others' running jobs; %s", [missing_capability(request_project, urgent_capability)]),
	request_project,
) if {
	input.action == "job.submit"
	input.params.queue == "urgent"
	holds(request_project, "job.submit")
	not holds(request_project, "job.submit.urgent")
} else := project_grant(
	action_rule[input.action],
	sprintf("%s holds %s %s", [actor, project_capability[input.action], in_project(request_project)]),
	request_project, 0, nobody, [],
) if {
	holds(request_project, project_capability[input.action])
} else := refuse(
	"M1.no_capability", missing_capability(request_project, project_capability[input.action]), request_project,
) if {
	project_capability[input.action]
} else := refuse(
	# Mutating job actions always name their jobs: an empty selection is refused, not guessed (H2).
	"H2.no_targets", sprintf("%s names no target jobs", [input.action]), request_project,
) if {
	input.action in job_actions
} else := refuse("unknown_action", sprintf("unknown action %v", [input.action]), request_project)

# Passed to missing_capability through a rule, not as a literal: rego-cpp's sprintf prints a string literal
# given straight to a function with its quotes, which breaks the decision's JSON (it then fails closed).
urgent_capability := "job.submit.urgent"

# Rule ids for the audit trail, by action.
action_rule := {
	"job.submit": "submit.member",
	"job.view": "A1.member",
	"role.manage": "M1.role_manage",
	"policy.reload": "policy.reload",
	"ledger.read": "H3.ledger_read",
	"approval.grant": "M2.approval_grant",
}
