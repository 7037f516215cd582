"""Failure signatures: one TOML file per signature id (data, read by postmortem.catalog)."""
