"""Policy files: YAML tasks, thresholds and checks parsed into ``router.PolicySet``, with hot reload.

``load_policy(path)`` reads and validates one file (errors name the file, line and key);
``PolicyStore`` keeps the last good policy in force and swaps in valid changes without a restart.
``PolicyFile.model_json_schema()`` is the file's JSON Schema, for editors.
"""

from ._convert import NeedsExamples
from ._load import load_policy, parse_policy, policy_version
from ._reload import Listener, PolicyStore, ReloadResult
from ._schema import PolicyFile

__all__ = [
    "Listener",
    "NeedsExamples",
    "PolicyFile",
    "PolicyStore",
    "ReloadResult",
    "load_policy",
    "parse_policy",
    "policy_version",
]
