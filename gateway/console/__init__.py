"""The web console at /ui: server-rendered pages over the same services and decision pipeline as the API."""
