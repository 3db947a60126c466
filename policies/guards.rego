# Guards that refuse a request whatever the matrix grants: call sources (H1, F1), batch limits (H2),
# written reasons for external-rights jobs (R3). Thresholds come from data.json.
package jobgate.authz

import rego.v1

# `default ... := false`: rego-cpp caches a rule's value within a query only when the rule is defined, so a
# false rule without a default is evaluated again at every reference.
default mutating := false

mutating if {
	action := input.action
	not action == "job.view"
}

# Each guard starts with its cheapest test, so the common single-job request leaves most of them
# after one comparison (batch-wide counts are computed only for batches).
# rego-cpp runs a body's tests in source order, except in a body that iterates (`some`): there the tests
# that do not depend on the iteration run first, in reverse source order. So a guard that iterates is
# gated by one cached rule.

# H1: node agents report; they never change jobs through the gateway.
denials contains {"rule": "H1.node_cannot_act", "reason": sprintf("%s is a node identity; nodes cannot request job actions", [actor])} if {
	actor_kind == "node"
}

# C2: while an emergency stop's hold (emergency.rego) is in force, no job enters its scope: neither a new one
# nor a paused one resuming. The gateway lists the holds a job falls under, only when there are some: in
# params.emergency_holds for a submission, in each target's emergency_holds for a resume.
denials contains {
	"rule": "C2.emergency_hold",
	"reason": sprintf("emergency stop %v (%v concern) holds %v %v: no new jobs there until it is lifted (jobgate emergency-stop lift %v)", [h.emergency_id, h.trigger, h.scope.kind, h.scope.value, h.emergency_id]),
} if {
	input.action == "job.submit"
	hs := input.params.emergency_holds
	some h in hs
}

denials contains {
	"rule": "C2.emergency_hold",
	"reason": sprintf("job %v is in %v %v, which emergency stop %v (%v concern) holds: it may not resume until the hold is lifted (jobgate emergency-stop lift %v)", [t.id, h.scope.kind, h.scope.value, h.emergency_id, h.trigger, h.emergency_id]),
} if {
	input.action == "job.resume"
	ts := targets
	some t in ts
	hs := t.emergency_holds
	some h in hs
}

# F1: every automation identity must map back to a responsible person and a trigger source.
denials contains {
	"rule": "F1.unattributed_service",
	"reason": sprintf("service account %s must name its responsible person and trigger", [actor]),
} if {
	actor_kind == "service"
	not service_attributed
}

default service_attributed := false

service_attributed if {
	is_string(input.actor.responsible)
	input.actor.responsible != ""
	is_string(input.actor.trigger)
	input.actor.trigger != ""
}

# H2 ceilings per call (so a wrong selector cannot empty a queue) and R1, for batches: one `batch` test
# for all of them (batch_denials).
denials contains d if {
	batch
	bs := batch_denials
	some d in bs
}

batch_denials contains {
	"rule": "H2.jobs_per_batch",
	"reason": sprintf("the request names %d jobs; at most %d per batch", [target_count, data.limits.jobs_per_batch]),
} if {
	target_count > data.limits.jobs_per_batch
	mutating
	not input.action in unbatched_actions
}

batch_denials contains {
	"rule": "H2.projects_per_batch",
	"reason": sprintf("the request spans %d projects; at most %d per batch", [count(target_projects), data.limits.projects_per_batch]),
} if {
	# A batch cannot span more projects than it has jobs.
	target_count > data.limits.projects_per_batch
	count(target_projects) > data.limits.projects_per_batch
	mutating
	not input.action in unbatched_actions
}

# One job: its own GPUs (a job without `gpus` counts none). Several: their sum.
denials contains {
	"rule": "H2.gpus_per_call",
	"reason": sprintf("the request affects %d GPUs; at most %d per call", [gpus, data.limits.gpus_per_call]),
} if {
	mutating
	target_count == 1
	gpus := targets[0].gpus
	gpus > data.limits.gpus_per_call
	not input.action in unbatched_actions
}

batch_denials contains {
	"rule": "H2.gpus_per_call",
	"reason": sprintf("the request affects %d GPUs; at most %d per call", [gpus_at_stake, data.limits.gpus_per_call]),
} if {
	gpus_at_stake > data.limits.gpus_per_call
	mutating
	not input.action in unbatched_actions
}

target_projects := {t.project | some t in ts} if ts := targets

# More than one job named: only then can the batch guards apply. Neither none nor one, as two
# equality tests rather than `>` (a builtin call, subjects.rego).
default batch := false

batch if {
	n := target_count
	not n == 0
	not n == 1
}

gpus_at_stake := object.get(targets[0], "gpus", 0) if {
	target_count == 1
} else := sum([object.get(t, "gpus", 0) | some t in ts]) if ts := targets

# R1: one job named twice is a malformed selection; refuse rather than guess.
# The denial is built in the body, after the test: rego-cpp builds a constant rule head before the body.
batch_denials contains d if {
	ts := targets
	count({t.id | some t in ts}) != count(ts)
	d := {"rule": "R1.duplicate_target", "reason": "the request names the same job more than once"}
}

# R3: stopping, pausing or deleting a job on external-rights data needs a written reason.
denials contains {
	"rule": "R3.reason_required",
	"reason": sprintf("job %s uses data of external rights holder %s: a written reason is required to %s it", [t.id, t.rights_holder, verb]),
} if {
	r3_reason_missing
	ts := targets
	some t in ts
	t.external_rights == true
}

default r3_reason_missing := false

r3_reason_missing if {
	any_external_target
	input.action in reason_actions
	not reason_given
}

reason_actions := {"job.stop", "job.pause", "job.delete"}
