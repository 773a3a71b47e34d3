"""``dflash relay``: checkpoints from a trainer to eval hosts through this machine."""
