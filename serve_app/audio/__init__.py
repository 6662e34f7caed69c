"""Audio requests between the router and the speech and transcription deployments."""
