# F2, F3: break-glass grants for on-call troubleshooting. This file judges the request for a grant;
# calls made later with the granted credential are judged like any other call — the gateway lets the
# grant stand in for the second person only, and records every such call as a bypass.
package jobgate.authz

import rego.v1

# Named rather than written at call sites: rego-cpp 1.x keeps the quotes of a literal function argument.
breakglass_cap := "breakglass.request"

breakglass_subject := "break-glass"

breakglass_params := object.get(input, "params", {})

breakglass_seconds := object.get(breakglass_params, "duration_seconds", 0)

default breakglass_justified := false

# A reason or ticket of null (the gateway sends null when none was given) is no text: tested with is_string
# first, since trim_space(null) is an error under OPA's strict builtin errors.
breakglass_justified if {
	is_string(input.reason)
	is_string(input.ticket)
	count(trim_space(input.reason)) > 0
	count(trim_space(input.ticket)) > 0
}

# 1. A reason and a ticket are required. 2. At most data.breakglass.max_seconds. 3. Only a holder of
# breakglass.request in every project (on-call, bound globally). 4. A second on-call confirms when
# data.breakglass.second_oncall_approvals says so.
breakglass_finding := refuse(
	"F2.reason_and_ticket", "a break-glass grant needs a written reason and a ticket", breakglass_subject,
) if {
	not breakglass_justified
} else := refuse(
	"F2.max_duration",
	sprintf("a break-glass grant lasts at most %d seconds; %v were asked for", [data.breakglass.max_seconds, breakglass_seconds]),
	breakglass_subject,
) if {
	breakglass_seconds > data.breakglass.max_seconds
} else := refuse("F2.oncall_only", missing_capability(global_project, breakglass_cap), breakglass_subject) if {
	not holds(global_project, breakglass_cap)
} else := project_grant(
	"F2.break_glass_grant",
	sprintf("%s may hold a temporary break-glass grant", [actor]),
	breakglass_subject,
	data.breakglass.second_oncall_approvals,
	{"roles": ["oncall"], "principals": [], "projects": ["*"]},
	[],
)
