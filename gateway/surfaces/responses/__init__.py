"""OpenAI Responses (`/v1/responses`)."""
