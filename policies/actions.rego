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
} else := project_grant(
	action_rule[input.action],
	sprintf("%s holds %s in project %s", [actor, project_capability[input.action], request_project]),
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

# Rule ids for the audit trail, by action.
action_rule := {
	"job.submit": "submit.member",
	"job.view": "A1.member",
	"role.manage": "M1.role_manage",
	"policy.reload": "policy.reload",
	"ledger.read": "H3.ledger_read",
	"approval.grant": "M2.approval_grant",
}
