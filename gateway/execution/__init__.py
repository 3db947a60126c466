"""Execution backends: what carries out a decided mutation (DESIGN.md, "Execution behind a port")."""
