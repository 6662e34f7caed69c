"""Stand-ins for the platform's outside parts, for tests that run the Gateway in process."""

from tests.fakes.deployments import (
    Call,
    FakeDeployment,
    FakeEmbeddingDeployment,
    FakeImageDeployment,
    FakeTextDeployment,
    FakeVideoDeployment,
    at_capacity,
    count_prompt_tokens,
    crashed,
    fake_deployments,
    offline,
    reported,
)

__all__ = [
    "Call",
    "FakeDeployment",
    "FakeEmbeddingDeployment",
    "FakeImageDeployment",
    "FakeTextDeployment",
    "FakeVideoDeployment",
    "at_capacity",
    "count_prompt_tokens",
    "crashed",
    "fake_deployments",
    "offline",
    "reported",
]
