"""fastslow's composition root: settings in, a wired router out; the HTTP app; the command line."""

from ._compose import Runtime, build_runtime, default_policy_path

__all__ = ["Runtime", "build_runtime", "create_app", "default_policy_path"]


def __getattr__(name: str) -> object:
    # The HTTP app pulls in FastAPI and the database layer; import it only when asked for.
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)
