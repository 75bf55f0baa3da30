"""Faults and hostile input: each test fails if a record is lost or doubled."""
