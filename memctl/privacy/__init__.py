"""Controlling what a bank knows (`memctl block`, `unblock`, `audit`, `forget`,
`verify-forgotten`): provenance, blocking, exact forgetting by retraining, and the proof that a
forgotten document is gone.

Owns: privacy controls, forgetting and its proof.
May import: memctl.core, memctl.registry, memctl.model, memctl.build, memctl.train, memctl.serve,
memctl.eval.
"""
