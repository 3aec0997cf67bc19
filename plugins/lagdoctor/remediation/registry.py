"""The actions runbooks choose from, by name: the built-in ones, and any registered in code.

Above the action modules (they import only the interface, remediation.actions),
so the registry and its actions do not import each other. Cheap to import: the
action modules load no client library until a step runs.
"""

from __future__ import annotations

from typing import Mapping

from lagdoctor.remediation.actions import Action
from lagdoctor.remediation.k8s import RestartConsumers, ScaleConsumers
from lagdoctor.remediation.kafka_ops import AddPartitions, SkipPoisonPill
from lagdoctor.remediation.recommend import RecommendConsumerConfig

BUILTIN_ACTIONS: tuple[type[Action], ...] = (
    ScaleConsumers, RestartConsumers, SkipPoisonPill, AddPartitions, RecommendConsumerConfig)

_REGISTRY: dict[str, Action] = {}


def register(cls: type[Action]) -> type[Action]:
    if cls.name in _REGISTRY:
        raise ValueError(f"action {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls()
    return cls


for _builtin in BUILTIN_ACTIONS:
    register(_builtin)


def registered_actions() -> Mapping[str, Action]:
    return dict(_REGISTRY)


def get_action(name: str) -> Action:
    actions = registered_actions()
    try:
        return actions[name]
    except KeyError:
        raise KeyError(f"unknown action {name!r} (registered: {', '.join(sorted(actions))})") from None


def action_names() -> tuple[str, ...]:
    """The branch targets a DAG builds: one task per registered action."""
    return tuple(sorted(registered_actions()))
