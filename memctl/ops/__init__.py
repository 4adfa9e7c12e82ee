"""Operating on whole banks: `memctl info`, `doctor`, `export` and `import` (archives and the
leftovers of killed exports), and the bank owner's console logic behind `memctl browse`.

Owns: bank-wide reports, checks, repairs and transfers.
May import: every library package (memctl.core ... memctl.privacy); never memctl.cli or memctl.tui.
"""
