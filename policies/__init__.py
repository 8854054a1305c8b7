"""Policy files: YAML tasks, thresholds and checks parsed into ``fastslow.router.PolicySet``, with hot reload.

``load_policy(path)`` reads and validates one file (errors name the file, line and key);
``PolicyStore`` keeps the last good policy in force and swaps in valid changes without a restart.
``PolicyFile.model_json_schema()`` is the file's JSON Schema, for editors. ``locate_policy``
says which file a process uses: ``FASTSLOW_POLICY_FILE``, else ``./fastslow-policy.yaml``, else
the example policy built into the package. ``suggest(word, choices)`` is the "did you mean" its
errors end with, for other code naming a key, task or option. ``describe_policy`` gives the tasks as
plain data (what ``fastslow policy check`` prints and ``GET /v1/tasks`` returns).
"""

from ._base import suggest
from ._convert import NeedsExamples
from ._describe import describe_policy, describe_task
from ._load import load_policy, parse_policy, policy_version
from ._locate import BUILTIN_POLICY, POLICY_FILE_NAME, PolicyOrigin, PolicySource, locate_policy
from ._reload import Listener, PolicyStore, ReloadResult
from ._schema import PolicyFile

__all__ = [
    "BUILTIN_POLICY",
    "POLICY_FILE_NAME",
    "Listener",
    "NeedsExamples",
    "PolicyFile",
    "PolicyOrigin",
    "PolicySource",
    "PolicyStore",
    "ReloadResult",
    "describe_policy",
    "describe_task",
    "load_policy",
    "locate_policy",
    "parse_policy",
    "policy_version",
    "suggest",
]
