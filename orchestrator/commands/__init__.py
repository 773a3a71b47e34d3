"""One thin module per command group (parse, call the library, print), each ``register(app)``."""
