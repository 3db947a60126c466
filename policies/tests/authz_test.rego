# Unit tests of the decision rules, with capabilities given directly (no Casbin).
#
# Convention (rego-cpp 1.x crashes on `with input as` over these rules, so inputs are not swapped
# inside a rule): for each `test_X`, the rule `given_X` is the request; the runner evaluates
# data.jobgate.authz.decision on it and then queries `test_X` with input
# {"request": given_X, "decision": <that decision>}. A test without `given_X` runs with empty input.
# Each test names the requirement it checks.
package jobgate.authz_test

import rego.v1

job := {
	"id": "j-1", "project": "vision", "creator": "alice", "creator_kind": "person", "owner": "alice",
	"beneficiary_project": "vision", "rights_holder": "vision", "external_rights": false,
	"state": "running", "environment": "research", "valid_until": null, "expired": false, "gpus": 8,
}

stop_by(actor_id, granted) := {
	"action": "job.stop", "actor": {"id": actor_id, "kind": "person"}, "project": "vision",
	"targets": [job], "reason": "hung", "granularity": "job", "approvals": [], "granted": granted,
	"now": "2026-11-29T10:00:00Z",
}

queue_admin_caps := {"vision": ["job.stop.any", "job.view"]}

d := input.decision

# Fail closed: an empty input is a deny with a reason.
given_default_is_deny := {}

test_default_is_deny if {
	d.effect == "deny"
	count(d.reasons) > 0
}

# A4: the owner stops their own job.
given_a4_owner_stops_own_job := stop_by("alice", {"vision": ["job.stop.own"]})

test_a4_owner_stops_own_job if {
	d.effect == "allow"
	"A4.own_job" in d.rules
}

# A4: a queue admin needs one second person, and the owner is among those who may confirm.
given_a4_queue_admin_needs_second_person := stop_by("bob", queue_admin_caps)

test_a4_queue_admin_needs_second_person if {
	d.effect == "needs_approval"
	d.approvals_required.count == 1
	"alice" in d.approvals_required.principals
}

# M2: an approval by the actor themselves never counts.
given_m2_self_approval_ignored := object.union(
	stop_by("bob", queue_admin_caps),
	{"approvals": [{"by": "bob", "roles_by_project": {"vision": ["queue_admin"]}}]},
)

test_m2_self_approval_ignored if d.effect == "needs_approval"

# M2: on-call's approval completes it.
given_m2_oncall_approval_allows := object.union(
	stop_by("bob", queue_admin_caps),
	{"approvals": [{"by": "olga", "roles_by_project": {"*": ["oncall"]}}]},
)

test_m2_oncall_approval_allows if d.effect == "allow"

# Deny wins over needs_approval: one forbidden job in a batch denies the whole batch.
given_deny_wins_over_needs_approval := object.union(
	stop_by("bob", queue_admin_caps),
	{"targets": [job, object.union(job, {"id": "j-2", "creator": "svc-train", "creator_kind": "service"})]},
)

test_deny_wins_over_needs_approval if {
	d.effect == "deny"
	d.rules == ["A8.oncall_only"]
}

# The deny sentence names the missing capability and the project.
given_missing_capability_sentence := stop_by("mallory", {})

test_missing_capability_sentence if {
	d.reasons == ["mallory holds no role in project vision that grants job.stop.any"]
}

# R3: a blank reason on an external-rights job is a deny.
given_r3_reason_required := object.union(
	stop_by("bob", queue_admin_caps),
	{"targets": [object.union(job, {"external_rights": true, "rights_holder": "acme"})], "reason": "  "},
)

test_r3_reason_required if {
	d.effect == "deny"
	"R3.reason_required" in d.rules
}

# H2: the GPU ceiling is read from data.json.
given_h2_gpu_limit := object.union(
	stop_by("alice", {"vision": ["job.stop.own"]}),
	{"targets": [object.union(job, {"gpus": data.limits.gpus_per_call + 1})]},
)

test_h2_gpu_limit if "H2.gpus_per_call" in d.rules

# A5: pausing another's job tells its owner.
given_a5_pause_notifies_owner := object.union(stop_by("olga", {"vision": ["job.pause.any"]}), {"action": "job.pause"})

test_a5_pause_notifies_owner if {
	d.effect == "allow"
	some o in d.obligations
	o.kind == "notify_owner"
	o.owner == "alice"
}

# Determinism: reasons and rules come out sorted, so equal inputs give byte-equal decisions.
given_rules_sorted := object.union(
	stop_by("olga", {"vision": ["job.stop.any"], "nlp": ["job.stop.any"]}),
	{"targets": [job, object.union(job, {"id": "j-2", "project": "nlp", "owner": "dave", "creator": "dave"})]},
)

test_rules_sorted if {
	d.rules == sort(d.rules)
	"H2.cross_project_batch" in d.rules
}
