"""Coding-agent CLIs as workers: presets (data), their commands, provisions and checks."""
