"""``dflash parity``: two hosts' target features compared (docs/parity.md)."""
