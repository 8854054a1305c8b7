"""fastslow's composition root: settings in, a wired router out; the command line."""

from ._compose import Runtime, build_runtime, default_policy_path

__all__ = ["Runtime", "build_runtime", "default_policy_path"]
