"""Step 2 of a request: who is calling (Bearer API keys; wallet sign-in arrives with x402)."""
