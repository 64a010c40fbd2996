"""Comparison of two dumps: pairs (pairs.py) judged by expectations (expectations.py) into findings
(findings.py), case by case (case.py). Data only: reports/text.py turns findings into words.

This file imports nothing: harness.case imports compare.expectations, and compare.case imports
harness.case.
"""
