"""Who may hold which power: service accounts and their tokens (F1), role bindings (M1), break-glass grants (F2,
F3) and node enrolment (H1). Each change is decided and ledgered like any other."""
