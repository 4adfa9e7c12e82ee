"""Textual apps: the bank owner's console (`memctl browse`) and the chat (`memctl chat`), styled by memctl.tcss."""
