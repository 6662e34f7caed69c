"""Wire models (pydantic) of requests and responses, one module per resource."""
