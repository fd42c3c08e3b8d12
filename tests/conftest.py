"""Shared pytest setup. Keep it small: fixtures used by one file live in that file."""
