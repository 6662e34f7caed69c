"""Stand-ins for the platform's outside parts, for tests that run the Gateway in process: the
real deployment classes behind Serve-like handles, their engines fakes (tests/fakes/served.py).
"""

from tests.fakes.embedding import FakeEmbeddingDeployment, FakeEmbeddingEngine
from tests.fakes.fleet import fake_deployments
from tests.fakes.handles import (
    Call,
    DeploymentHandle,
    at_capacity,
    crashed,
    offline,
    reported,
)
from tests.fakes.image import FakeImageDeployment, FakeImageEngine
from tests.fakes.served import FakeEngine, ServedDeployment
from tests.fakes.speech import FakeSpeechDeployment
from tests.fakes.text import FakeTextDeployment, FakeTextEngine, count_prompt_tokens
from tests.fakes.transcription import FakeTranscriptionDeployment, FakeTranscriptionEngine
from tests.fakes.video import FakeVideoDeployment, FakeVideoEngine, plain_mp4

__all__ = [
    "Call",
    "DeploymentHandle",
    "FakeEmbeddingDeployment",
    "FakeEmbeddingEngine",
    "FakeEngine",
    "FakeImageDeployment",
    "FakeImageEngine",
    "FakeSpeechDeployment",
    "FakeTextDeployment",
    "FakeTextEngine",
    "FakeTranscriptionDeployment",
    "FakeTranscriptionEngine",
    "FakeVideoDeployment",
    "FakeVideoEngine",
    "ServedDeployment",
    "at_capacity",
    "count_prompt_tokens",
    "crashed",
    "fake_deployments",
    "offline",
    "plain_mp4",
    "reported",
]
