"""Textual apps: chat with a bank (the bank browser is a later issue)."""
