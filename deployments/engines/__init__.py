"""Engines behind small per-modality interfaces; deployments hold engines, routes never see them."""
