"""Tests of the Spark connector (a package, so its conftest does not shadow the shared one)."""
