"""What hosts and models are: ``dflash hosts check`` and ``dflash probe``."""
