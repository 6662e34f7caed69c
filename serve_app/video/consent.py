"""Consent for face media: a model whose catalog entry has a `consent` policy takes media that
shows a face only with the caller's consent, as the published interface asks for it.

    consent:
      flow: seedance            # the object the caller sends: consents.seedance
      aliases: [face-media]     # other names accepted for it
      version: "2026-11-01"
      policy_text: ...
      docs_url: ...

Without it, a job whose inputs show a face (faces.py) is a 409 `needs_consent` naming the
flow, the roles of the media that showed one, and the policy to accept. Media without a face
needs no consent.
"""

from __future__ import annotations

from typing import Any

from serve_app.errors import ApiError
from serve_app.models.catalog import CatalogModel
from serve_app.models.constraints import ConsentPolicy

REQUIRED = ("confirmed_terms_and_privacy", "confirmed_legal_right",
            "confirmed_screening_acknowledged")
# The role the consent body names for each media field.
FACE_MEDIA_ROLES = {"image_url": "image", "end_image_url": "end_image",
                    "reference_image_urls": "reference_image", "video_url": "video",
                    "reference_video_urls": "reference_video"}


def policy_of(model: CatalogModel) -> ConsentPolicy | None:
    policy = model.video_constraints.consent
    return policy if policy is not None and policy.flow else None


def consent_given(policy: ConsentPolicy, consents: dict[str, Any] | None) -> bool:
    """Whether `consents` holds the policy's object (under its flow or an alias) with every
    confirmation set to true."""
    names = [policy.flow, *policy.aliases]
    for name in names:
        given = (consents or {}).get(name)
        if isinstance(given, dict) and all(given.get(field) is True for field in REQUIRED):
            return True
    return False


def needs_consent(model: CatalogModel, policy: ConsentPolicy, roles: list[str]) -> ApiError:
    """The published 409 body for media of `roles` that showed a face."""
    flow = policy.flow
    return ApiError(409, "needs_consent", raw_body={
        "error": {"code": "needs_consent",
                  "message": f"{model.id} needs your consent before it takes media that shows "
                             f"a face ({', '.join(roles)}): send consents.{flow} with "
                             f"{', '.join(REQUIRED)} set to true"},
        "consent_flow": flow,
        "face_media_roles": roles,
        "consent": {"consent_version": policy.version, "policy_text": policy.policy_text},
        "docs_url": policy.docs_url or "",
    })
