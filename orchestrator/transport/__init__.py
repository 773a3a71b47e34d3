"""How the controller reaches hosts: SSH settings, host sessions, the remote bundle."""
