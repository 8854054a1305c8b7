"""``GET /v1/tasks``: the policy in force, task by task, for clients and the console.

What ``fastslow policy check`` prints (``fastslow.policies.describe_policy``): each task's kind,
engine, System-2 model, options, thresholds (a check: each rule's bands), calibration and the
``fitted:`` records, with the policy's version. A client reads the routes it may be sent to, the
verdicts a check gives and what its decisions are held to, without a copy of the YAML file.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from fastslow.policies import describe_policy

from ._errors import ERROR_RESPONSES
from .deps import ReaderDep, ServicesDep, TenantRouterDep

__all__ = ["TaskOut", "TasksResponse", "router"]

router = APIRouter(prefix="/v1", tags=["policy"])


class ThresholdsOut(BaseModel):
    min_confidence: float
    min_margin: float


class QuestionOut(BaseModel):
    kind: Literal["noul", "choice", "score"]
    options: list[str]


class RuleOut(BaseModel):
    options: list[str]
    violation: str = Field(description="The option that means the rule is violated.")
    deny_at: float = Field(description="Deny when P(violation) is at or above this.")
    allow_at: float = Field(description="Allow when P(violation) is at or below this; review in between.")
    examples: int = Field(description="Labelled examples the rule has in the policy file.")


class CalibrationOut(BaseModel):
    temperature: float
    questions: list[str] = Field(default_factory=list, description="Questions with a calibration of their own.")


class TaskOut(BaseModel):
    """One task of the policy in force."""

    kind: Literal["route", "classify", "check"]
    engine: str = Field(description="The System-1 engine that answers it.")
    escalate_to: str | None = Field(description="The System-2 model low-confidence decisions go to.")
    mode: Literal["live", "shadow"]
    on_failure: str
    thresholds: ThresholdsOut | None = Field(default=None, description="Routes and classifications.")
    routes: list[str] | None = Field(default=None, description="A route task's routes, none_of_these included.")
    none_of_these: str | None = Field(default=None, description="The out-of-scope route; choosing it escalates.")
    questions: dict[str, QuestionOut] | None = Field(default=None, description="A classification's questions.")
    rules: dict[str, RuleOut] | None = Field(default=None, description="A check's rules and their bands.")
    calibration: CalibrationOut
    fitted: dict[str, dict[str, Any]] = Field(
        description="What `fastslow calibrate` and `fastslow tune` measured, by what they fitted (docs/tuning.md)."
    )


class TasksResponse(BaseModel):
    policy_version: str = Field(description="The sha256 of the policy file in force, as every decision records it.")
    tasks: dict[str, TaskOut]


@router.get("/tasks", response_model=TasksResponse, responses=ERROR_RESPONSES)
async def tasks(tenant_router: TenantRouterDep, services: ServicesDep, caller: ReaderDep) -> TasksResponse:
    """The tasks of the policy in force, with what their decisions are held to."""
    del caller  # authenticated: the policy is the deployment's, the same for every tenant
    policy = tenant_router.policy
    described = describe_policy(policy, default_engine=services.settings.engine)
    return TasksResponse(
        policy_version=policy.version,
        tasks={name: TaskOut.model_validate(about) for name, about in described.items()},
    )
