"""Reporters: each turns a CaseComparison into one output form."""
