"""fastslow's composition root: the command line (and, next, the HTTP service)."""

__all__: list[str] = []
