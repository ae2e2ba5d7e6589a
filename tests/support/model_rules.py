"""The model-based test's machine with all its rules (tests/engine/test_model.py): the
publishes (plain, and under a dedup key or an Idempotency-Key), the deliveries and the control
of jobs, queues and groups, each a mixin of ``ModelMachine`` (tests/support/model_machine.py).
Hypothesis takes a machine's rules from all its classes, in the order of their names."""

from __future__ import annotations

from tests.support.model_control import ControlRules
from tests.support.model_delivery import DeliveryRules
from tests.support.model_publish import PublishRules
from tests.support.model_publish_keyed import KeyedPublishRules


class EngineModel(PublishRules, KeyedPublishRules, DeliveryRules, ControlRules):
    """Every rule, every check (``ModelMachine.engine_agrees`` after each step)."""
