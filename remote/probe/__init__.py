"""Host facts and model probes (``facts``, ``probe``); torch only inside the commands."""
