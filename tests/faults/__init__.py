"""Faults and hostile input (issue 11): each test fails if a record is lost or doubled."""
