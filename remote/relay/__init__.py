"""Host-side halves of ``dflash relay`` (stdlib only)."""
