"""Measuring a bank (`memctl eval`): probe accuracy per setup, perplexity, stored resumable runs,
aggregates with intervals, and reports.

Owns: evaluation plans, runs and results.
May import: memctl.core, memctl.registry, memctl.model, memctl.build, memctl.train, memctl.serve.
"""
