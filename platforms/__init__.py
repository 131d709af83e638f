"""Chip descriptions: one YAML file per chip, loaded into frozen, validated objects."""
