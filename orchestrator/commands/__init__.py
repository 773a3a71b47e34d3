"""One module per command group; each exposes ``register(app)`` and stays a thin layer
that parses options, calls a library function and prints its result."""
